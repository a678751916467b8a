//! The GPU half on a real GPU: kernel output against the CPU pattern, the verify kernel,
//! dma-buf export, the capability report and the staged path. Every test skips, with the
//! reason on stderr, where CUDA finds no GPU (CI); they run on the H200 machine.
#![cfg(feature = "cuda")]

use gpu_kernels::pattern;
use host::gpu::allocations::{DeviceMemory, PinnedHostMemory};
use host::gpu::capabilities;
use host::gpu::sources::{verify_on_cpu, GpuDirectBuffer, StagedSource};
use host::gpu::{driver, Gpu};
use host::memory::select::DeviceRegistration;
use host::memory::{RecvSink, SendSource};
use integration_tests::skip;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Element counts from the issue: tiny, around a block, the seed's, odd, and 1 GiB.
const SIZES: [u64; 6] = [1, 255, 256, 4096, (1 << 20) + 3, 1 << 28];

fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            skip(test, &format!("no GPU: {e:#}"));
            None
        }
    }
}

/// Bytes as i32s.
fn as_i32(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn kernel_output_equals_the_cpu_pattern_in_device_memory() {
    let Some(gpu) = gpu_or_skip("kernel_output_equals_the_cpu_pattern_in_device_memory") else {
        return;
    };
    for elements in SIZES {
        let memory = DeviceMemory::new(elements as usize * 4).unwrap();
        // Poison first, so an element the kernel skips cannot pass by luck.
        gpu.memset_d32_async(memory.ptr(), 0xdead_beef, elements as usize)
            .unwrap();
        gpu.generate(memory.ptr(), elements).unwrap();
        let mut bytes = vec![0u8; elements as usize * 4];
        memory.read_into(&mut bytes).unwrap();
        let values = as_i32(&bytes);
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
        let memory = PinnedHostMemory::mapped(elements as usize * 4).unwrap();
        let device = memory.device_ptr().unwrap();
        gpu.memset_d32_async(device, 0xdead_beef, elements as usize)
            .unwrap();
        gpu.generate(device, elements).unwrap();
        let values = as_i32(memory.as_bytes());
        assert_eq!(
            pattern::first_mismatch(&values, 0),
            None,
            "{elements} elements"
        );
    }
}

#[test]
fn verify_kernel_finds_planted_mismatches_and_none_on_good_data() {
    let Some(gpu) = gpu_or_skip("verify_kernel_finds_planted_mismatches_and_none_on_good_data")
    else {
        return;
    };
    for elements in [(1u64 << 20) + 3, 1 << 28] {
        let memory = DeviceMemory::new(elements as usize * 4).unwrap();
        gpu.generate(memory.ptr(), elements).unwrap();
        let good = gpu.verify(memory.ptr(), elements).unwrap();
        assert_eq!((good.mismatches, good.first_mismatch), (0, None));
        for bad in [0, elements / 2, elements - 1] {
            let plant = |value: i32| {
                driver::memcpy_htod(memory.ptr() + bad * 4, &value.to_ne_bytes()).unwrap()
            };
            plant(-7);
            let check = gpu.verify(memory.ptr(), elements).unwrap();
            assert_eq!((check.mismatches, check.first_mismatch), (1, Some(bad)));
            plant(pattern::value(bad));
        }
        // Two at once: the count adds up and the first is the lowest.
        driver::memcpy_htod(memory.ptr() + 4 * (elements - 1), &(-1i32).to_ne_bytes()).unwrap();
        driver::memcpy_htod(memory.ptr() + 4 * 3, &(-1i32).to_ne_bytes()).unwrap();
        let check = gpu.verify(memory.ptr(), elements).unwrap();
        assert_eq!((check.mismatches, check.first_mismatch), (2, Some(3)));
        // And the CPU agrees with the GPU.
        let cpu = verify_on_cpu(&memory).unwrap();
        assert_eq!((cpu.mismatches, cpu.first_mismatch), (2, Some(3)));
    }
}

#[test]
fn dma_buf_export_gives_an_fd_of_the_right_length() {
    let Some(gpu) = gpu_or_skip("dma_buf_export_gives_an_fd_of_the_right_length") else {
        return;
    };
    let caps = capabilities::capabilities(gpu.raw_device()).unwrap();
    if !caps.dma_buf {
        skip(
            "dma_buf_export_gives_an_fd_of_the_right_length",
            "the driver reports no dma-buf support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)",
        );
        return;
    }
    let gpu = Rc::new(gpu);
    for len in [4usize, 16 << 10, (64 << 10) + 4, 256 << 20] {
        let buffer =
            GpuDirectBuffer::generate(gpu.clone(), len, DeviceRegistration::DmaBuf).unwrap();
        let exported = buffer.dma_buf_len().expect("an fd whose size can be read");
        // Whole 64 KiB GPU pages covering the buffer.
        assert!(exported as usize >= len, "{exported} < {len}");
        assert_eq!(exported % (64 << 10), 0, "{exported}");
        assert!(exported as usize <= len.next_multiple_of(64 << 10) + (64 << 10));
        assert_eq!(
            SendSource::first_values(&buffer, 5).unwrap()[..5.min(len / 4)],
            [0, 2, 4, 6, 8][..5.min(len / 4)]
        );
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

#[test]
fn staged_source_delivers_the_pattern_chunk_by_chunk() {
    let Some(gpu) = gpu_or_skip("staged_source_delivers_the_pattern_chunk_by_chunk") else {
        return;
    };
    let (len, chunk) = ((64 << 20) + 12, 1 << 20);
    let mut source = StagedSource::generate(Rc::new(gpu), len, chunk).unwrap();
    let in_flight = source.max_chunks_in_flight().unwrap();
    let mut posted = std::collections::VecDeque::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut offset = 0;
    while offset < len || !posted.is_empty() {
        if offset < len && posted.len() < in_flight {
            let n = chunk.min(len - offset);
            let addr = source.prepare_chunk(offset, n, deadline).unwrap();
            // SAFETY (test): the staged source returned a pinned slot holding n bytes.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
            let values = as_i32(bytes);
            assert_eq!(
                pattern::first_mismatch(&values, (offset / 4) as u64),
                None,
                "chunk at {offset}"
            );
            posted.push_back(offset);
            offset += n;
        } else {
            source.release_chunk(posted.pop_front().unwrap());
        }
    }
}

#[test]
fn gpudirect_receive_buffer_is_checked_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("gpudirect_receive_buffer_is_checked_on_the_gpu") else {
        return;
    };
    let caps = capabilities::capabilities(gpu.raw_device()).unwrap();
    let method = if caps.dma_buf {
        DeviceRegistration::DmaBuf
    } else {
        DeviceRegistration::PeerMem
    };
    let gpu = Rc::new(gpu);
    let mut sink = GpuDirectBuffer::new(gpu.clone(), 1 << 20, method).unwrap();
    // Fresh buffer: not the pattern.
    assert!(sink.verify(1 << 20).unwrap().mismatches > 0);
    let filled = GpuDirectBuffer::generate(gpu, 1 << 20, method).unwrap();
    let mut filled: Box<dyn RecvSink> = Box::new(filled);
    let v = filled.verify(1 << 20).unwrap();
    assert_eq!(
        (v.elements, v.mismatches, v.first_mismatch, v.crc32),
        (1 << 18, 0, None, None)
    );
}
