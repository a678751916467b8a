//! The GPU half on a real GPU: kernel output against the CPU pattern, bounds, lengths and
//! alignment the launches refuse, the verify kernel, dma-buf export, the capability
//! report, and the staged source driven by the sender's own chunk schedule.
//!
//! A test skips only where the driver reports no GPU ([`GpuError::is_no_gpu`]: CI's
//! machines); on a machine with a GPU, any other failure to open it (a PTX that does not
//! load, a broken driver) fails the test with its cause. They run on the H200 machine.
#![cfg(feature = "cuda")]

use gpu_kernels::pattern;
use host::gpu::allocations::{DeviceBuffer, MappedHostBuffer, GPU_PAGE};
use host::gpu::capabilities;
use host::gpu::sources::{verify_on_cpu, GpuDirectBuffer, StagedSource};
use host::gpu::{Gpu, KERNELS_PTX};
use host::memory::host_buffer::verify_bytes;
use host::memory::{RecvSink, SendSource, POISON};
use host::memory_path::DeviceRegistration;
use host::transfer::memcpy_wire::MemcpyWire;
use host::transfer::plan::ChunkPlan;
use host::transfer::schedule::Schedule;
use integration_tests::skip;
use std::rc::Rc;
use std::time::Duration;

/// Element counts: tiny, around a block, the seed's, odd, and 1 GiB.
const SIZES: [u64; 6] = [1, 255, 256, 4096, (1 << 20) + 3, 1 << 28];

/// Open GPU 0 with `ptx`; skip (None) only if the driver reports no GPU.
///
/// # Safety
/// As [`Gpu::open_with_ptx`]: `ptx` is the embedded kernels, or PTX that does not load.
unsafe fn open_or_skip(test: &str, ptx: &str) -> Option<Rc<Gpu>> {
    // SAFETY: the caller's contract.
    match unsafe { Gpu::open_with_ptx(0, ptx) } {
        Ok(gpu) => Some(gpu),
        Err(e) if e.is_no_gpu() => {
            skip(test, &e.to_string());
            None
        }
        Err(e) => panic!("{test}: this machine has a GPU, but it could not be opened: {e}"),
    }
}

fn gpu_or_skip(test: &str) -> Option<Rc<Gpu>> {
    // SAFETY: the kernels this build embeds.
    unsafe { open_or_skip(test, KERNELS_PTX) }
}

/// Bytes as i32s.
fn as_i32(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_all(memory: &DeviceBuffer) -> Vec<i32> {
    let mut bytes = vec![0u8; memory.len()];
    memory.read_into(&mut bytes).unwrap();
    as_i32(&bytes)
}

/// PTX that cannot load: the real PTX with its body cut off.
fn corrupted_ptx() -> String {
    let cut = KERNELS_PTX.find(".entry").unwrap_or(KERNELS_PTX.len() / 2);
    format!(
        "{}\n.entry broken( {{ this is not PTX\n",
        &KERNELS_PTX[..cut]
    )
}

#[test]
fn kernel_output_equals_the_cpu_pattern_in_device_memory() {
    let Some(gpu) = gpu_or_skip("kernel_output_equals_the_cpu_pattern_in_device_memory") else {
        return;
    };
    for elements in SIZES {
        let mut memory = DeviceBuffer::new(&gpu, elements as usize * 4).unwrap();
        // Poison first, so an element the kernel skips cannot pass by luck.
        gpu.fill_d32(&mut memory, POISON).unwrap();
        gpu.generate(&mut memory).unwrap();
        let values = read_all(&memory);
        assert_eq!(
            pattern::first_mismatch(&values, 0),
            None,
            "{elements} elements"
        );
        assert_eq!(
            &values[..values.len().min(5)],
            &[0, 2, 4, 6, 8][..values.len().min(5)]
        );
    }
}

#[test]
fn kernel_output_equals_the_cpu_pattern_in_mapped_host_memory() {
    let Some(gpu) = gpu_or_skip("kernel_output_equals_the_cpu_pattern_in_mapped_host_memory")
    else {
        return;
    };
    for elements in SIZES {
        let mut memory = MappedHostBuffer::new(&gpu, elements as usize * 4).unwrap();
        gpu.fill_d32(&mut memory, POISON).unwrap();
        gpu.generate(&mut memory).unwrap();
        let values = as_i32(memory.as_bytes());
        assert_eq!(
            pattern::first_mismatch(&values, 0),
            None,
            "{elements} elements"
        );
    }
}

#[test]
fn the_kernel_writes_nothing_past_either_end() {
    let Some(gpu) = gpu_or_skip("the_kernel_writes_nothing_past_either_end") else {
        return;
    };
    // Guard words before (16 bytes, keeping the 16-byte alignment) and after the slice
    // the kernel is given; every tail length 0-3 and sizes around a block.
    const GUARD: usize = 64;
    for elements in [
        1usize,
        2,
        3,
        4,
        5,
        255,
        256,
        257,
        1023,
        1024,
        1025,
        4099,
        (1 << 20) + 3,
    ] {
        let mut memory = DeviceBuffer::new(&gpu, (elements + 2 * GUARD) * 4).unwrap();
        gpu.fill_d32(&mut memory, POISON).unwrap();
        let start = GUARD * 4;
        gpu.generate(&mut memory.slice_mut(start..start + elements * 4).unwrap())
            .unwrap();
        let values = read_all(&memory);
        let poison = POISON as i32;
        assert!(
            values[..GUARD].iter().all(|&v| v == poison),
            "{elements}: a guard word before the slice was written"
        );
        assert!(
            values[GUARD + elements..].iter().all(|&v| v == poison),
            "{elements}: a guard word after the slice was written (first: {:?})",
            values[GUARD + elements..].iter().position(|&v| v != poison)
        );
        assert_eq!(
            pattern::first_mismatch(&values[GUARD..GUARD + elements], 0),
            None,
            "{elements}"
        );
    }
}

#[test]
fn lengths_that_are_not_whole_elements_are_refused() {
    let Some(gpu) = gpu_or_skip("lengths_that_are_not_whole_elements_are_refused") else {
        return;
    };
    for len in [1usize, 2, 3, 6, 4097] {
        let mut memory = DeviceBuffer::new(&gpu, len).unwrap();
        let e = gpu.generate(&mut memory).unwrap_err().to_string();
        assert!(
            e.contains("not a whole number of i32 elements"),
            "{len}: {e}"
        );
        let e = gpu.verify(&memory).unwrap_err().to_string();
        assert!(
            e.contains("not a whole number of i32 elements"),
            "{len}: {e}"
        );
    }
    let mut memory = DeviceBuffer::new(&gpu, 64).unwrap();
    assert!(gpu.generate(&mut memory.slice_mut(0..10).unwrap()).is_err());
}

#[test]
fn misaligned_addresses_are_refused_and_nothing_is_written() {
    let Some(gpu) = gpu_or_skip("misaligned_addresses_are_refused_and_nothing_is_written") else {
        return;
    };
    let mut memory = DeviceBuffer::new(&gpu, 4096).unwrap();
    gpu.fill_d32(&mut memory, POISON).unwrap();
    for offset in [4usize, 8, 12, 20] {
        let e = gpu
            .generate(&mut memory.slice_mut(offset..offset + 256).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("16-byte aligned"), "{offset}: {e}");
        let e = gpu
            .verify(&memory.slice(offset..offset + 256).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("16-byte aligned"), "{offset}: {e}");
    }
    assert!(read_all(&memory).iter().all(|&v| v == POISON as i32));
    // Out of bounds is refused before anything reaches the GPU.
    assert!(memory.slice_mut(4000..4100).is_err());
    assert!(memory.slice(usize::MAX - 1..usize::MAX).is_err());
}

#[test]
fn more_than_2_pow_30_elements_in_a_4_gib_plus_buffer() {
    let Some(gpu) = gpu_or_skip("more_than_2_pow_30_elements_in_a_4_gib_plus_buffer") else {
        return;
    };
    // 2^30 + 5 elements: 4 GiB + 20 bytes, the index past 2^30 where 2*i leaves i32.
    let elements = (1usize << 30) + 5;
    let mut memory = DeviceBuffer::new(&gpu, elements * 4).unwrap();
    gpu.fill_d32(&mut memory, POISON).unwrap();
    gpu.generate(&mut memory).unwrap();
    let check = gpu.verify(&memory).unwrap();
    assert_eq!((check.mismatches, check.first_mismatch), (0, None));
    // The CPU reads the values around 2^30 and at the end: the pattern wraps there.
    for first in [(1usize << 30) - 4, elements - 4] {
        let mut bytes = [0u8; 16];
        memory.read_range_into(first * 4, &mut bytes).unwrap();
        let want: Vec<i32> = (first..first + 4)
            .map(|i| pattern::value(i as u64))
            .collect();
        assert_eq!(as_i32(&bytes), want, "elements from {first}");
    }
    assert_eq!(pattern::value(1 << 30), i32::MIN);
    // And a mismatch past 2^30 is found at its index.
    let bad = (1usize << 30) + 2;
    memory.write(bad * 4, &7i32.to_ne_bytes()).unwrap();
    let check = gpu.verify(&memory).unwrap();
    assert_eq!(
        (check.mismatches, check.first_mismatch),
        (1, Some(bad as u64))
    );
}

#[test]
fn verify_kernel_finds_planted_mismatches_and_none_on_good_data() {
    let Some(gpu) = gpu_or_skip("verify_kernel_finds_planted_mismatches_and_none_on_good_data")
    else {
        return;
    };
    for elements in [(1u64 << 20) + 3, 1 << 28] {
        let mut memory = DeviceBuffer::new(&gpu, elements as usize * 4).unwrap();
        gpu.generate(&mut memory).unwrap();
        let good = gpu.verify(&memory).unwrap();
        assert_eq!((good.mismatches, good.first_mismatch), (0, None));
        for bad in [0, elements / 2, elements - 1] {
            let at = bad as usize * 4;
            memory.write(at, &(-7i32).to_ne_bytes()).unwrap();
            let check = gpu.verify(&memory).unwrap();
            assert_eq!((check.mismatches, check.first_mismatch), (1, Some(bad)));
            memory
                .write(at, &pattern::value(bad).to_ne_bytes())
                .unwrap();
        }
        // Two at once: the count adds up and the first is the lowest.
        memory
            .write(4 * (elements as usize - 1), &(-1i32).to_ne_bytes())
            .unwrap();
        memory.write(4 * 3, &(-1i32).to_ne_bytes()).unwrap();
        let check = gpu.verify(&memory).unwrap();
        assert_eq!((check.mismatches, check.first_mismatch), (2, Some(3)));
        // And the CPU agrees with the GPU.
        let cpu = verify_on_cpu(&memory).unwrap();
        assert_eq!((cpu.mismatches, cpu.first_mismatch), (2, Some(3)));
    }
}

fn dma_buf_or_skip(test: &str, gpu: &Gpu) -> bool {
    let caps = capabilities::capabilities(gpu.raw_device()).unwrap();
    if !caps.dma_buf {
        skip(
            test,
            "the driver reports no dma-buf support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)",
        );
    }
    caps.dma_buf
}

#[test]
fn dma_buf_export_gives_whole_pages_from_the_buffers_first_byte() {
    let test = "dma_buf_export_gives_whole_pages_from_the_buffers_first_byte";
    let Some(gpu) = gpu_or_skip(test) else { return };
    if !dma_buf_or_skip(test, &gpu) {
        return;
    }
    for len in [4usize, 16 << 10, (64 << 10) + 4, 256 << 20] {
        let buffer = GpuDirectBuffer::generate(&gpu, len, DeviceRegistration::DmaBuf).unwrap();
        let exported = buffer.dma_buf_len().expect("an fd whose size can be read");
        assert_eq!(exported as usize, len.next_multiple_of(GPU_PAGE), "{len}");
        assert_eq!(
            SendSource::first_values(&buffer, 5).unwrap()[..5.min(len / 4)],
            [0, 2, 4, 6, 8][..5.min(len / 4)]
        );
    }
}

#[test]
fn a_misaligned_allocation_base_still_exports_a_dma_buf_of_the_right_length() {
    let test = "a_misaligned_allocation_base_still_exports_a_dma_buf_of_the_right_length";
    let Some(gpu) = gpu_or_skip(test) else { return };
    if !dma_buf_or_skip(test, &gpu) {
        return;
    }
    // As if cuMemAlloc had returned base + skew (it guarantees only 256-byte alignment).
    for skew in [256usize, 4096, GPU_PAGE - 256] {
        let len = (1 << 20) + 4;
        let mut memory = DeviceBuffer::page_aligned_with_skew(&gpu, len, skew).unwrap();
        assert!(memory.offset_in_allocation() >= skew as u64, "skew {skew}");
        assert_eq!(memory.page_span(), Some(len.next_multiple_of(GPU_PAGE)));
        gpu.generate(&mut memory).unwrap();
        let buffer = GpuDirectBuffer::prepare(memory, DeviceRegistration::DmaBuf).unwrap();
        assert_eq!(
            buffer.dma_buf_len(),
            Some(len.next_multiple_of(GPU_PAGE) as u64),
            "skew {skew}"
        );
        let check = gpu.verify(buffer.device()).unwrap();
        assert_eq!(check.mismatches, 0);
    }
}

#[test]
fn capability_report_matches_the_driver() {
    let Some(gpu) = gpu_or_skip("capability_report_matches_the_driver") else {
        return;
    };
    let reports = capabilities::report_all().unwrap();
    assert!(!reports.is_empty());
    let first = &reports[0];
    assert_eq!(first.name, gpu.name());
    assert_eq!(
        first.capabilities,
        capabilities::capabilities(gpu.raw_device()).unwrap()
    );
    let (major, _) = first.compute_capability.split_once('.').unwrap();
    assert!(
        major.parse::<u32>().unwrap() >= 7,
        "{}",
        first.compute_capability
    );
    assert!(
        [0, 100, 200].contains(&first.rdma_writes_ordering),
        "{}",
        first.rdma_writes_ordering
    );
    eprintln!("{first:#?}");
}

/// Send `source` once through the sender's schedule to a memcpy consumer; return the
/// bytes that arrived.
fn through_the_schedule(source: &dyn SendSource, chunk: u64, depth: u32) -> Vec<u8> {
    let plan = ChunkPlan::new(source.len() as u64, chunk).unwrap();
    let schedule = Schedule::new(plan, depth, source, Duration::from_secs(30));
    let (run, arrived) = MemcpyWire::scope(source.memory(), vec![0; source.len()], |wire| {
        schedule.run(source, wire, "memcpy")
    })
    .unwrap();
    run.unwrap();
    arrived
}

#[test]
fn a_staged_source_serves_transfer_after_transfer() {
    let Some(gpu) = gpu_or_skip("a_staged_source_serves_transfer_after_transfer") else {
        return;
    };
    let (len, chunk) = ((64 << 20) + 12, 1 << 20);
    let source = StagedSource::generate(&gpu, len, chunk).unwrap();
    for transfer in 0..3 {
        let arrived = through_the_schedule(&source, chunk as u64, 16);
        let v = verify_bytes(&arrived);
        assert!(v.ok(), "transfer {transfer}: {v:?}");
        assert_eq!(v.elements, len as u64 / 4);
    }
}

#[test]
fn a_raw_staged_transfer_of_64_mib_sends_exactly_the_copied_bytes() {
    let Some(gpu) = gpu_or_skip("a_raw_staged_transfer_of_64_mib_sends_exactly_the_copied_bytes")
    else {
        return;
    };
    // --raw is one message of the whole buffer: the source stages it in one slot.
    let len = 64 << 20;
    let source = StagedSource::generate(&gpu, len, len).unwrap();
    assert_eq!(source.ring_shape(), (1, len));
    for _ in 0..2 {
        let arrived = through_the_schedule(&source, len as u64, 1);
        assert!(verify_bytes(&arrived).ok());
    }
    // A ring of 1 MiB slots refuses a 64 MiB chunk, naming its limit.
    let small = StagedSource::generate(&gpu, len, 1 << 20).unwrap();
    small.begin_pass().unwrap();
    let far = std::time::Instant::now() + Duration::from_secs(10);
    let e = small.prepare_chunk(0, len, far).unwrap_err().to_string();
    assert!(e.contains("slots of 1048576 bytes"), "{e}");
}

#[test]
fn a_gpu_receive_buffer_that_nobody_wrote_fails_verification() {
    let Some(gpu) = gpu_or_skip("a_gpu_receive_buffer_that_nobody_wrote_fails_verification") else {
        return;
    };
    let caps = capabilities::capabilities(gpu.raw_device()).unwrap();
    let method = if caps.dma_buf {
        DeviceRegistration::DmaBuf
    } else {
        DeviceRegistration::PeerMem
    };
    let len = 1 << 20;
    // Memory that held the verified pattern just before is what a new buffer is likely
    // to get: fill some, free it, then take a receive buffer.
    drop(GpuDirectBuffer::generate(&gpu, len, method).unwrap());
    let sink = GpuDirectBuffer::receive(&gpu, len, method).unwrap();
    let v = sink.verify(len).unwrap();
    assert_eq!(
        (v.elements, v.mismatches, v.first_mismatch),
        (1 << 18, 1 << 18, Some(0))
    );
    // A buffer with the pattern verifies; poisoned again, it fails again.
    let filled = GpuDirectBuffer::generate(&gpu, len, method).unwrap();
    let v = filled.verify(len).unwrap();
    assert_eq!(
        (v.elements, v.mismatches, v.first_mismatch, v.crc32),
        (1 << 18, 0, None, None)
    );
    filled.poison().unwrap();
    assert_eq!(filled.verify(len).unwrap().mismatches, 1 << 18);
}

#[test]
fn corrupted_ptx_is_an_error_not_a_missing_gpu() {
    let test = "corrupted_ptx_is_an_error_not_a_missing_gpu";
    if gpu_or_skip(test).is_none() {
        return;
    }
    // SAFETY: PTX that does not load: no kernel of it can run.
    let e = unsafe { Gpu::open_with_ptx(0, &corrupted_ptx()) }
        .err()
        .expect("refused");
    assert!(!e.is_no_gpu(), "{e}");
    assert!(e.to_string().contains("cuModuleLoadData"), "{e}");
    // And the tests' own helper fails (panics) on it instead of skipping.
    // SAFETY: as above.
    let helper = std::panic::catch_unwind(|| unsafe { open_or_skip(test, &corrupted_ptx()) });
    assert!(
        helper.is_err(),
        "a GPU test would have skipped on a broken kernel build"
    );
}

/// What a GPU test does when the kernel build is broken: it fails. Run by hand on the GPU
/// machine (`--ignored`) to see it; it must fail there, and skips only without a GPU.
#[test]
#[ignore = "demonstration: fails on a machine with a GPU, by design"]
fn demonstration_a_gpu_test_on_a_broken_kernel_build_fails() {
    // SAFETY: PTX that does not load: no kernel of it can run.
    let Some(gpu) = (unsafe {
        open_or_skip(
            "demonstration_a_gpu_test_on_a_broken_kernel_build_fails",
            &corrupted_ptx(),
        )
    }) else {
        return;
    };
    let mut memory = DeviceBuffer::new(&gpu, 16).unwrap();
    gpu.generate(&mut memory).unwrap();
}

// --- soundness: contexts, foreign buffers, uploads, sizes ------------------------------------

#[test]
fn another_current_context_does_not_redirect_allocations_or_launches() {
    let test = "another_current_context_does_not_redirect_allocations_or_launches";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    // Other code makes a context of its own current, through cust's safe API.
    let device = cust::device::Device::get_device(0).unwrap();
    let other = cust::context::legacy::Context::create_and_push(
        cust::context::legacy::ContextFlags::empty(),
        device,
    )
    .unwrap();
    // Allocated, filled and checked while that context is current: each call binds
    // the GPU's own context, so everything lands there.
    let len = 1 << 20;
    let mut buffer = DeviceBuffer::new(&gpu, len).unwrap();
    gpu.generate(&mut buffer).unwrap();
    assert_eq!(gpu.verify(&buffer).unwrap().mismatches, 0);
    // Destroying the other context frees whatever was allocated in it. Had the buffer
    // gone there (as before the binding), what follows would fail or read freed memory.
    drop(other);
    assert_eq!(gpu.verify(&buffer).unwrap().mismatches, 0);
    assert!(verify_on_cpu(&buffer).unwrap().ok());
    let mut again = DeviceBuffer::new(&gpu, len).unwrap();
    gpu.generate(&mut again).unwrap();
    assert!(verify_on_cpu(&again).unwrap().ok());
}

#[test]
fn a_buffer_of_another_gpu_is_refused() {
    let test = "a_buffer_of_another_gpu_is_refused";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    // A second Gpu value (here of the same device; on a machine with two GPUs, GPU 1 is
    // refused the same way): its launches take only its own buffers.
    let other = gpu_or_skip(test).unwrap();
    let mut buffer = DeviceBuffer::new(&gpu, 4096).unwrap();
    let e = other.generate(&mut buffer).unwrap_err().to_string();
    assert!(e.contains("belongs to another GPU"), "{e}");
    let e = other.verify(&buffer).unwrap_err().to_string();
    assert!(e.contains("belongs to another GPU"), "{e}");
    // The owner still can, and its buffer still holds what it wrote.
    gpu.generate(&mut buffer).unwrap();
    drop(other); // one of the two dropped: the context stays with the other
    assert_eq!(gpu.verify(&buffer).unwrap().mismatches, 0);
    let mut fresh = DeviceBuffer::new(&gpu, 4096).unwrap();
    gpu.generate(&mut fresh).unwrap();
    assert!(verify_on_cpu(&fresh).unwrap().ok());
}

#[test]
fn an_upload_is_not_readable_before_its_copies_land() {
    let test = "an_upload_is_not_readable_before_its_copies_land";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let (len, chunk, writers) = (64usize << 20, 1usize << 20, 4);
    let mut upload = host::gpu::upload::DeviceUpload::new(&gpu, len, chunk, writers).unwrap();
    // Four writers at once, each its own quarter of the chunks, as four TCP streams.
    let seen_while_filling = std::sync::Mutex::new(Vec::new());
    upload
        .fill(writers, Duration::from_secs(30), |k, writer| {
            for i in (k..len / chunk).step_by(writers) {
                writer.write_at(i * chunk, chunk, |slot| {
                    for (e, word) in slot.chunks_exact_mut(4).enumerate() {
                        word.copy_from_slice(
                            &pattern::value((i * chunk / 4 + e) as u64).to_ne_bytes(),
                        );
                    }
                    Ok(())
                })?;
            }
            seen_while_filling.lock().unwrap().push(k);
            Ok(())
        })
        .unwrap();
    assert_eq!(seen_while_filling.lock().unwrap().len(), writers);
    let memory = upload.memory().unwrap();
    assert_eq!(gpu.verify(memory).unwrap().mismatches, 0);
}

/// Issue 24, item 10, the run-time half (the compile-time half: `host::gpu`'s
/// `compile_fail` example, a writer swapped between nested fills): a writer thread that
/// runs an upload of its own, on a GPU handle of its own, inside another upload's fill;
/// each writer fills its own upload, and both land whole.
#[test]
fn nested_fills_each_land_their_own_bytes() {
    let Some(gpu) = gpu_or_skip("nested_fills_each_land_their_own_bytes") else {
        return;
    };
    let (len, chunk) = (4usize << 20, 1usize << 20);
    let write_pattern = |writer: &mut host::gpu::upload::SlotWriter<'_>| {
        for i in 0..len / chunk {
            writer.write_at(i * chunk, chunk, |slot| {
                for (e, word) in slot.chunks_exact_mut(4).enumerate() {
                    word.copy_from_slice(&pattern::value((i * chunk / 4 + e) as u64).to_ne_bytes());
                }
                Ok(())
            })?;
        }
        Ok::<(), String>(())
    };
    let mut outer = host::gpu::upload::DeviceUpload::new(&gpu, len, chunk, 1).unwrap();
    let inner_ok = std::sync::atomic::AtomicBool::new(false);
    outer
        .fill(1, Duration::from_secs(30), |_, writer| {
            let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
            let mut inner = host::gpu::upload::DeviceUpload::new(&gpu, len, chunk, 1)
                .map_err(|e| e.to_string())?;
            inner.fill(1, Duration::from_secs(30), |_, w| write_pattern(w))?;
            let v = gpu
                .verify(inner.memory().map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            inner_ok.store(v.mismatches == 0, std::sync::atomic::Ordering::Relaxed);
            drop(inner); // its ring is freed; the outer writer lends only its own
            write_pattern(writer)
        })
        .unwrap();
    assert!(inner_ok.into_inner(), "the inner upload landed whole");
    assert_eq!(gpu.verify(outer.memory().unwrap()).unwrap().mismatches, 0);
}

/// Issue 24, item 12: page-locked memory is written (zeroed) before any `&[u8]` over it
/// is handed out: CUDA does not promise `cuMemHostAlloc` zeroes it. (Reading
/// uninitialized bytes is undefined behaviour whatever they hold, so no run can show the
/// old hole; this checks the promise the SAFETY note now rests on, on the H200's driver.)
#[test]
fn page_locked_buffers_read_as_zeroes_when_new() {
    let Some(gpu) = gpu_or_skip("page_locked_buffers_read_as_zeroes_when_new") else {
        return;
    };
    // Sizes no other test asks for: a buffer of a size given back earlier is taken again
    // as it was left (see the next test), not new.
    for len in [1usize, 4099, (64 << 20) + 13] {
        let mut pinned = host::gpu::allocations::PinnedHostBuffer::new(&gpu, len).unwrap();
        assert!(pinned.as_bytes().iter().all(|&b| b == 0), "{len} bytes");
    }
}

/// Page-locked buffers are kept for reuse (the staging rings of one transfer after
/// another): one given back is what the next of its size gets, on the same device, and a
/// buffer of another size is another allocation.
#[test]
fn a_page_locked_buffer_given_back_is_what_the_next_of_its_size_gets() {
    use host::gpu::allocations::PinnedHostBuffer;
    use host::memory::{Registrable, RegistrationTarget};
    let Some(gpu) =
        gpu_or_skip("a_page_locked_buffer_given_back_is_what_the_next_of_its_size_gets")
    else {
        return;
    };
    let address = |b: &PinnedHostBuffer| match b.target() {
        RegistrationTarget::Host { ptr, .. } => ptr.as_ptr() as usize,
        _ => panic!("page-locked memory is host memory"),
    };
    let len = (3 << 20) + 7;
    let first = PinnedHostBuffer::new(&gpu, len).unwrap();
    let at = address(&first);
    drop(first);
    let second = PinnedHostBuffer::new(&gpu, len).unwrap();
    assert_eq!(
        address(&second),
        at,
        "the buffer given back was not taken again"
    );
    let other = PinnedHostBuffer::new(&gpu, len + 1).unwrap();
    assert_ne!(address(&other), at);
    // Opened again (a transfer's own `Gpu`), the device's kept buffer is still there.
    drop(second);
    let again = Gpu::open(0).unwrap();
    let third = PinnedHostBuffer::new(&again, len).unwrap();
    assert_eq!(address(&third), at);
}

/// Issue 24, item 11: `crc32c_chunks_with_piece(buf, 4096, u64::MAX)` made the kernel's
/// piece arithmetic wrap, so a warp read past the buffer on the device. Now the wrapper
/// refuses a piece larger than its chunk (the kernel's arithmetic is checked too), the
/// GPU is left working, and every other shape near `u64::MAX` gives right CRCs.
#[test]
fn a_piece_near_u64_max_is_refused_and_the_gpu_keeps_working() {
    let Some(gpu) = gpu_or_skip("a_piece_near_u64_max_is_refused_and_the_gpu_keeps_working") else {
        return;
    };
    let (memory, data) = random_on_gpu(&gpu, 8192, 0, 11);
    for piece in [u64::MAX, u64::MAX / 2 + 1, 4097] {
        let e = crc32c_chunks_with_piece(&memory, 4096, piece).unwrap_err();
        assert!(
            e.to_string().contains("larger than its chunk"),
            "{piece}: {e}"
        );
        let mut out = DeviceBuffer::new(&gpu, 8).unwrap();
        // SAFETY: refused before anything is queued.
        let launched = unsafe { launch_crc32c_chunks_shaped(&memory, 4096, piece, 256, &mut out) };
        assert!(launched.is_err(), "piece {piece} was launched");
    }
    // Chunks of u64::MAX bytes (one chunk, the whole buffer) with the largest pieces
    // allowed: the kernel's sums stay in range.
    for (chunk, piece) in [
        (u64::MAX, u64::MAX),
        (u64::MAX, u64::MAX - 1),
        (u64::MAX, 4096),
    ] {
        let got = crc32c_chunks_with_piece(&memory, chunk, piece).unwrap();
        assert_eq!(
            got,
            chunk_crcs(&data, data.len()),
            "chunk {chunk}, piece {piece}"
        );
    }
    gpu.synchronize().unwrap();
    assert_eq!(
        crc32c_chunks(&memory, 4096).unwrap(),
        chunk_crcs(&data, 4096)
    );
}

#[test]
fn a_skew_that_wraps_is_an_error_not_a_buffer_outside_its_allocation() {
    let test = "a_skew_that_wraps_is_an_error_not_a_buffer_outside_its_allocation";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    // The audit's skews: GPU_PAGE + skew wrapped to a small number in a release build,
    // so a small allocation was made and the buffer started before it. Now the sizes are
    // checked before anything is allocated.
    for skew in [
        usize::MAX,
        usize::MAX - GPU_PAGE + 1,
        usize::MAX - GPU_PAGE + 4097,
    ] {
        let e = DeviceBuffer::page_aligned_with_skew(&gpu, 4096, skew)
            .err()
            .unwrap_or_else(|| panic!("skew {skew} gave a buffer"))
            .to_string();
        assert!(e.contains("cannot be allocated"), "{e}");
    }
    // A skew that does not overflow but cannot be had: the driver's refusal, no buffer.
    let e = DeviceBuffer::page_aligned_with_skew(&gpu, 4096, usize::MAX - 2 * GPU_PAGE)
        .err()
        .expect("no buffer for a skew of nearly 2^64");
    eprintln!("a skew of 2^64 - 2 pages: {e}");
    // A sensible skew still works, inside its allocation.
    let buffer = DeviceBuffer::page_aligned_with_skew(&gpu, 4096, 256).unwrap();
    assert!(buffer.offset_in_allocation() >= 256);
    assert_eq!(buffer.page_span(), Some(GPU_PAGE));
}

// ---- crc32c_chunks: the GPU's CRC32C of each chunk against the CPU's -------------------

use host::gpu::checksum::{
    crc32c_chunks, crc32c_chunks_with_piece, launch_crc32c_chunks, launch_crc32c_chunks_shaped,
};
use host::integrity::bench::random_bytes;
use host::integrity::chunk_crcs;

/// Random bytes in device memory, starting `offset` bytes into the allocation.
fn random_on_gpu(gpu: &Rc<Gpu>, len: usize, offset: usize, seed: u64) -> (DeviceBuffer, Vec<u8>) {
    let data = random_bytes(len, seed);
    let mut memory = DeviceBuffer::new(gpu, len + offset).unwrap();
    memory.write(offset, &data).unwrap();
    (memory, data)
}

#[test]
fn crc32c_kernel_equals_the_cpu_crate_for_many_lengths_chunks_pieces_and_offsets() {
    let Some(gpu) = gpu_or_skip(
        "crc32c_kernel_equals_the_cpu_crate_for_many_lengths_chunks_pieces_and_offsets",
    ) else {
        return;
    };
    let lengths = [
        1usize,
        3,
        4,
        15,
        16,
        17,
        511,
        512,
        513,
        4097,
        65_541,
        (1 << 20) + 3,
    ];
    let chunks = [1u64, 3, 4, 7, 512, 4097, 65_536, 1 << 20, u64::MAX];
    let pieces = [1u64, 17, 512, 4096, 65_536];
    let mut launches = 0;
    for (i, &len) in lengths.iter().enumerate() {
        // Offsets 0..15 from a 256-byte aligned allocation: every head length.
        let offset = i % 16;
        let (memory, data) = random_on_gpu(&gpu, len, offset, i as u64 + 1);
        let slice = memory.slice(offset..offset + len).unwrap();
        for &chunk in &chunks {
            let chunk = chunk.min(len as u64);
            let want = chunk_crcs(&data, chunk as usize);
            for &piece in &pieces {
                if len > 100_000 && (chunk < 512 || piece < 512) {
                    continue; // a million one-byte chunks would only slow the test
                }
                if piece > chunk {
                    // A piece larger than its chunk is the caller's mistake: refused.
                    let e = crc32c_chunks_with_piece(&slice, chunk, piece).unwrap_err();
                    assert!(e.to_string().contains("larger than its chunk"), "{e}");
                }
                let piece = piece.min(chunk);
                let got = crc32c_chunks_with_piece(&slice, chunk, piece).unwrap();
                assert_eq!(got.len(), want.len(), "{len} bytes, chunk {chunk}");
                if let Some(bad) = (0..want.len()).find(|&k| got[k] != want[k]) {
                    panic!(
                        "{len} bytes at offset {offset}, chunk {chunk}, piece {piece}: chunk {bad} is {:#010x} on the GPU, {:#010x} on the CPU",
                        got[bad], want[bad]
                    );
                }
                launches += 1;
            }
        }
    }
    assert!(launches > 400, "only {launches} launches ran");
}

#[test]
fn crc32c_kernel_over_1_gib_plus_3_bytes() {
    let Some(gpu) = gpu_or_skip("crc32c_kernel_over_1_gib_plus_3_bytes") else {
        return;
    };
    let len = (1usize << 30) + 3;
    let (memory, data) = random_on_gpu(&gpu, len, 0, 1017);
    // 1 MiB chunks (the last one 3 bytes), chunks that are no multiple of 4 (every piece
    // but the first unaligned), and one chunk of the whole buffer.
    for chunk in [1u64 << 20, (1 << 20) + 1, 4_000_003, len as u64] {
        let got = crc32c_chunks(&memory, chunk).unwrap();
        let want = chunk_crcs(&data, chunk as usize);
        assert_eq!(got.len(), want.len());
        if let Some(bad) = (0..want.len()).find(|&k| got[k] != want[k]) {
            panic!(
                "chunk {chunk}: chunk {bad} differs: GPU {:#010x}, CPU {:#010x}",
                got[bad], want[bad]
            );
        }
    }
}

#[test]
fn crc32c_kernel_names_exactly_the_chunk_with_a_flipped_bit() {
    let Some(gpu) = gpu_or_skip("crc32c_kernel_names_exactly_the_chunk_with_a_flipped_bit") else {
        return;
    };
    let (chunk, chunks) = (65_536 + 7, 40usize);
    let (mut memory, mut data) = random_on_gpu(&gpu, chunk * chunks - 5, 0, 99);
    let before = crc32c_chunks(&memory, chunk as u64).unwrap();
    assert_eq!(before, chunk_crcs(&data, chunk));
    for at in [0usize, 17, chunk * 7 + 3, chunk * 21 - 1, data.len() - 1] {
        data[at] ^= 0x10;
        memory.write(at, &data[at..at + 1]).unwrap();
        let after = crc32c_chunks(&memory, chunk as u64).unwrap();
        let changed: Vec<usize> = (0..chunks).filter(|&k| after[k] != before[k]).collect();
        assert_eq!(changed, vec![at / chunk], "bit flipped at byte {at}");
        data[at] ^= 0x10;
        memory.write(at, &data[at..at + 1]).unwrap();
    }
}

#[test]
fn crc32c_kernel_reads_mapped_host_memory_too() {
    let Some(gpu) = gpu_or_skip("crc32c_kernel_reads_mapped_host_memory_too") else {
        return;
    };
    // The generated pattern in mapped host memory: the GPU reads it over PCIe.
    let mut memory = MappedHostBuffer::new(&gpu, (4 << 20) + 12).unwrap();
    gpu.generate(&mut memory).unwrap();
    let got = crc32c_chunks(&memory, 1 << 20).unwrap();
    assert_eq!(got, chunk_crcs(memory.as_bytes(), 1 << 20));
}

#[test]
fn crc32c_launches_refuse_a_zero_chunk_and_a_short_output() {
    let Some(gpu) = gpu_or_skip("crc32c_launches_refuse_a_zero_chunk_and_a_short_output") else {
        return;
    };
    let memory = DeviceBuffer::new(&gpu, 4096).unwrap();
    let zero = crc32c_chunks(&memory, 0).unwrap_err().to_string();
    assert!(zero.contains("at least 1 byte"), "{zero}");
    let mut out = DeviceBuffer::new(&gpu, 4 * 3).unwrap();
    // SAFETY: refused before anything is queued; nothing runs.
    let short = unsafe { launch_crc32c_chunks(&memory, 1024, 512, &mut out) }
        .unwrap_err()
        .to_string();
    assert!(short.contains("need 4 CRCs"), "{short}");
    // The empty buffer has no chunks and no CRCs.
    let empty = DeviceBuffer::new(&gpu, 0).unwrap();
    assert!(crc32c_chunks(&empty, 1 << 20).unwrap().is_empty());
}

#[test]
fn crc32c_kernel_is_right_with_every_block_size_the_benchmark_tries() {
    let Some(gpu) = gpu_or_skip("crc32c_kernel_is_right_with_every_block_size_the_benchmark_tries")
    else {
        return;
    };
    let len = (3 << 20) + 5;
    let (memory, data) = random_on_gpu(&gpu, len, 3, 4242);
    let slice = memory.slice(3..3 + len).unwrap();
    for (chunk, piece) in [(4097u64, 1024u64), (1 << 20, 64 << 10)] {
        let want = chunk_crcs(&data, chunk as usize);
        let mut out = DeviceBuffer::new(&gpu, want.len() * 4).unwrap();
        for threads in [32u32, 128, 256, 512, 1024] {
            // SAFETY: synchronised below before out is read or either buffer dropped.
            let launched =
                unsafe { launch_crc32c_chunks_shaped(&slice, chunk, piece, threads, &mut out) };
            if let Err(e) = launched {
                // Only a block larger than the driver allows this kernel may be refused
                // (on the H200, 72 registers x 1024 threads exceed the register file),
                // and it must be refused by the wrapper, not fail at the launch.
                let text = e.to_string();
                assert!(
                    threads > 256 && text.contains("threads per block on this GPU"),
                    "{threads} threads: {text}"
                );
                continue;
            }
            gpu.synchronize().unwrap();
            let mut bytes = vec![0u8; want.len() * 4];
            out.read_into(&mut bytes).unwrap();
            let got: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            assert_eq!(got, want, "{threads} threads, chunk {chunk}, piece {piece}");
        }
        // SAFETY: refused before anything is queued.
        let odd = unsafe { launch_crc32c_chunks_shaped(&slice, chunk, piece, 100, &mut out) };
        assert!(odd.is_err(), "100 threads per block was accepted");
    }
}

/// The library's GPU faces (issue 25, item 7): a GPU buffer sent with `api::send_device`
/// (the checksum kernel computing every chunk's CRC32C on the sending GPU) lands in place
/// in a `DeviceBuffer` the receiving caller allocated (`Listener::receive_into_device`:
/// no buffer of the library's, the chunks checked by the checksum kernel there), with
/// faults injected and repaired into GPU memory.
#[test]
fn a_gpu_buffer_lands_in_place_in_a_callers_device_buffer_and_is_checked_there() {
    use host::api::{self, Options};
    use host::gpu::context::GpuMemory;
    let test = "a_gpu_buffer_lands_in_place_in_a_callers_device_buffer_and_is_checked_there";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let len = (64 << 20) + 3;
    let data: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
        .collect();
    let opts = Options {
        chunk: 1 << 20,
        streams: Some(4),
        max_resends: 8,
        test_inject_faults: Some(host::transfer::faults::FaultInjector::parse("1/5").unwrap()),
        timeout: Duration::from_secs(30),
        ..Options::default()
    };
    let listener = api::Listener::bind("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
    let addr = listener.local_addr();
    let receiving = std::thread::spawn(move || {
        // The receiving caller's own GPU value and buffer (Rc: this thread's).
        let gpu = Gpu::open(0).unwrap();
        let mut target = DeviceBuffer::new(&gpu, len).unwrap();
        let ptr = target.device_ptr();
        let report = listener.receive_into_device(&mut target).unwrap();
        let mut back = vec![0u8; len];
        target.read_into(&mut back).unwrap();
        (report, back, ptr == target.device_ptr())
    });
    let mut source = DeviceBuffer::new(&gpu, len).unwrap();
    source.write(0, &data).unwrap();
    let (sent, _source) = api::send_device(addr, source, &opts).unwrap();
    let (report, back, same) = receiving.join().unwrap();
    assert!(sent.receiver.is_some_and(|v| v.ok()));
    assert!(same);
    assert!(back == data, "the received GPU buffer differs");
    assert!(
        !report.integrity.repaired.is_empty(),
        "no chunk was repaired at 1/5"
    );
    eprintln!(
        "{test}: {} bytes, {} chunks repaired, path {:?}",
        report.bytes,
        report.integrity.repaired.len(),
        report.path
    );
}
