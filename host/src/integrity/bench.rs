//! `host bench crc32c`: the CPU's per-chunk CRC32C on one core, against a plain read of
//! the same bytes by the same core (the most a checksum pass over memory could reach), in
//! interleaved rounds. Prints JSON.

use super::{chunk_crcs, hardware_accelerated};
use anyhow::{ensure, Result};
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Median and spread of one figure over the rounds (GB/s); `host bench gpu` reports its
/// rounds with it too.
#[derive(Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub(crate) fn of(samples: &[f64]) -> Spread {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Spread {
            median: sorted[sorted.len() / 2],
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        }
    }
}

#[derive(Debug, Serialize)]
pub struct CpuCrcReport {
    pub cpu: String,
    /// GB = 10^9 bytes.
    pub unit: &'static str,
    pub bytes: usize,
    pub chunk_bytes: usize,
    pub rounds: usize,
    pub threads: usize,
    pub hardware_crc32c: bool,
    /// The CRC32C code path taken on this CPU (`crc-fast`'s words).
    pub crc32c_path: String,
    /// `integrity::chunk_crcs` (the `crc-fast` crate) over the buffer, one thread.
    pub crc32c_gb_per_s: Spread,
    pub reference: &'static str,
    pub reference_gb_per_s: Spread,
    /// crc32c median over reference median.
    pub ratio: f64,
}

/// Random bytes (xorshift64*), so the timing is not that of a special pattern.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = vec![0u8; len];
    for word in out.chunks_mut(8) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let v = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        word.copy_from_slice(&v[..word.len()]);
    }
    out
}

/// XOR of every 8-byte word, four independent accumulators: one core streaming the
/// bytes with as little work per byte as it can do.
fn read_all(data: &[u8]) -> u64 {
    let mut acc = [0u64; 4];
    let mut blocks = data.chunks_exact(32);
    for block in &mut blocks {
        for (i, a) in acc.iter_mut().enumerate() {
            *a ^= u64::from_ne_bytes(block[i * 8..i * 8 + 8].try_into().unwrap());
        }
    }
    let rest = blocks
        .remainder()
        .iter()
        .fold(0u64, |a, &b| a.rotate_left(8) ^ b as u64);
    acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ rest
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

pub fn run(bytes: usize, chunk: usize, rounds: usize) -> Result<CpuCrcReport> {
    ensure!(
        bytes > 0 && chunk > 0,
        "size and chunk must be at least 1 byte"
    );
    let data = random_bytes(bytes, 0x17);
    // The crate's answer, checked on a few chunks against the gpu-kernels arithmetic
    // (a different implementation: byte tables), so a fast wrong answer cannot pass.
    let first = chunk_crcs(&data, chunk);
    for (i, &crc) in first.iter().enumerate().take(4) {
        let end = ((i + 1) * chunk).min(bytes);
        ensure!(
            crc == gpu_kernels::crc32c::crc32c(&data[i * chunk..end]),
            "crc-fast and the table implementation disagree on chunk {i}"
        );
    }
    let gb_per_s = |took: f64| bytes as f64 / took / 1e9;
    let (mut crc, mut reference) = (Vec::new(), Vec::new());
    for round in 0..=rounds.max(1) {
        let started = Instant::now();
        let crcs = black_box(chunk_crcs(black_box(&data), chunk));
        let crc_took = started.elapsed().as_secs_f64();
        ensure!(crcs == first, "the CRCs changed between rounds");
        let started = Instant::now();
        black_box(read_all(black_box(&data)));
        let read_took = started.elapsed().as_secs_f64();
        if round > 0 {
            // Round 0 warms up (page faults are already taken by the fill).
            crc.push(gb_per_s(crc_took));
            reference.push(gb_per_s(read_took));
        }
    }
    let (crc, reference) = (Spread::of(&crc), Spread::of(&reference));
    Ok(CpuCrcReport {
        cpu: cpu_name(),
        unit: "GB/s = 1e9 bytes per second",
        bytes,
        chunk_bytes: chunk,
        rounds: rounds.max(1),
        threads: 1,
        hardware_crc32c: hardware_accelerated(),
        crc32c_path: super::cpu_path(),
        ratio: crc.median / reference.median,
        crc32c_gb_per_s: crc,
        reference:
            "XOR of every 8-byte word of the same buffer, one thread (one core's read bandwidth)",
        reference_gb_per_s: reference,
    })
}
