//! `host bench crc32c`: the CPU's per-chunk CRC32C (see `host::integrity::bench`).

use anyhow::Result;
use std::process::ExitCode;

pub fn run(size: u64, chunk: u64, rounds: u32) -> Result<ExitCode> {
    let report = host::integrity::bench::run(
        usize::try_from(size)?,
        usize::try_from(chunk)?,
        rounds as usize,
    )?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}
