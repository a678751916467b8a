//! `host bench rails`: the same transfer over each TCP rail alone and over all rails
//! striped, to a running `host recv`, rounds interleaved (each round: rail 0 alone,
//! rail 1 alone, ..., then all striped), so that a drift of the machine or the links
//! reaches every variant alike. The reference is the sum of the single-rail medians:
//! what perfect striping would reach. Every transfer must be verified by the receiver,
//! and a striped round in which a rail failed or was left out is an error, since its
//! rate would not be a striped rate.
//!
//! The source is the pattern written by the CPU into host memory, so that the GPU (or
//! its absence) plays no part: this measures the rails.

use super::tcp_bench::{median, stats};
use anyhow::{bail, Context, Result};
use host::cli::RailsBenchArgs;
use host::memory::select::AttemptLog;
use host::memory::HostBuffer;
use host::transfer::SendReport;
use host::transport::tcp::rails::{rails_of, Rail};
use host::transport::tcp::{self, TcpSendConfig};
use serde_json::json;
use std::process::ExitCode;

pub fn run(args: &RailsBenchArgs) -> Result<ExitCode> {
    let remotes = super::send::resolve_all(&args.ip, args.port)?;
    let rails = rails_of(&remotes, &args.bind_interfaces).map_err(anyhow::Error::msg)?;
    if rails.len() < 2 {
        bail!(
            "one rail: give several receiver addresses (a comma list) or several --bind-interfaces"
        );
    }
    let source = HostBuffer::with_pattern(usize::try_from(args.size)?)?;
    let mut alone: Vec<Vec<f64>> = vec![Vec::new(); rails.len()];
    let mut striped = Vec::new();
    let mut striped_chunks = Vec::new();
    for round in 1..=args.rounds {
        for (k, rail) in rails.iter().enumerate() {
            let r = transfer(args, &source, std::slice::from_ref(rail))
                .with_context(|| format!("round {round}: rail {k} ({}) alone", rail.label()))?;
            alone[k].push(r.gbps);
        }
        let r = transfer(args, &source, &rails)
            .with_context(|| format!("round {round}: all rails striped"))?;
        check_every_rail_carried(&r).with_context(|| format!("round {round}: striped"))?;
        striped_chunks.push(r.rails.iter().map(|x| x.chunks).collect::<Vec<_>>());
        striped.push(r.gbps);
    }
    let sum: f64 = alone.iter().map(|v| median(v)).sum();
    let ratio = median(&striped) / sum;
    if !ratio.is_finite() || ratio <= 0.0 {
        bail!("the ratio of the striped rate to the sum of the single-rail rates is {ratio}: no rate was measured");
    }
    let per_rail: Vec<_> = rails
        .iter()
        .zip(&alone)
        .enumerate()
        .map(|(k, (rail, rates))| {
            let mut s = stats(rates);
            s["rail"] = json!(k);
            s["local"] = json!(rail.local.map(|ip| ip.to_string()));
            s["remote"] = json!(rail.remote.to_string());
            s
        })
        .collect();
    let mut striped_stats = stats(&striped);
    striped_stats["chunks_per_rail_rounds"] = json!(striped_chunks);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "benchmark": "tcp rails: each rail alone and all rails striped, to a running receiver, rounds interleaved",
            "receiver": args.ip,
            "port": args.port,
            "bind_interfaces": args.bind_interfaces.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "bytes": args.size,
            "chunk_bytes": args.chunk.min(args.size),
            "streams_per_rail": args.streams,
            "rounds": args.rounds,
            "timeout_seconds": args.timeout.as_secs_f64(),
            "rail_timeout_seconds": args.rail_timeout.as_secs_f64(),
            "unit": "GB/s (10^9 bytes/s), as the sender reports it: first chunk out to last chunk written; every transfer verified by the receiver",
            "single_rail": per_rail,
            "sum_of_single_rail_medians_gb_per_s": sum,
            "striped": striped_stats,
            "ratio_striped_to_sum": ratio,
        }))?
    );
    Ok(ExitCode::SUCCESS)
}

/// One transfer of `source` over `rails` (one: that rail alone, bound to its local
/// address; several: striped), verified by the receiver, or why not.
fn transfer(args: &RailsBenchArgs, source: &HostBuffer, rails: &[Rail]) -> Result<SendReport> {
    let cfg = TcpSendConfig {
        peer: rails[0].remote,
        bytes: args.size,
        chunk: args.chunk.min(args.size),
        depth: 16,
        streams: args.streams,
        timeout: args.timeout,
        progress: false,
        protocol_version: host::transfer::header::VERSION,
        key: None,
        payload: host::transfer::PayloadOptions::default(),
        rails: rails.to_vec(),
        rail_timeout: args.rail_timeout,
        test_silent_rail: None,
    };
    let mut reports = tcp::send_repeated(&cfg, source, &AttemptLog::default(), 1)?;
    let report = reports.pop().context("the sender reported no transfer")?;
    match &report.receiver {
        Some(v) if v.ok() => Ok(report),
        Some(v) => bail!("the receiver did not verify the transfer: {:?}", v.status),
        None => bail!("the receiver gave no verdict"),
    }
}

/// A striped transfer counts only if every rail took part to the end.
fn check_every_rail_carried(report: &SendReport) -> Result<()> {
    for r in &report.rails {
        if let Some(why) = &r.left_out {
            bail!("rail {} ({}) was left out: {why}", r.rail, r.remote);
        }
        if let Some(why) = &r.failed {
            bail!("rail {} ({}) failed: {why}", r.rail, r.remote);
        }
    }
    Ok(())
}
