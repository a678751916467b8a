//! `host <ip> <port>`: generate the data, send it, report the receiver's verdict.

use super::facts::{memory_notes, path_facts};
use super::output::{iteration_error, values_line, verification_words, Human};
use anyhow::{bail, Context, Result};
use host::cli::SendArgs;
use host::memory::select::{plan, Direction, MemKind};
use host::memory::{GpuChoice, GpuSelection, SendMemory};
use host::transfer::units::format_bytes;
use host::transfer::{self, AckStatus, SendReport};
use host::transport::rdma::{self, SendConfig};
use host::transport::{self, TransportKind};
use serde_json::json;
use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

fn resolve_peer(host: &str, port: u16) -> Result<SocketAddr> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host name `{host}`"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .with_context(|| format!("host name `{host}` has no address"))
}

pub fn run(args: &SendArgs) -> Result<ExitCode> {
    let (Some(ip), Some(port)) = (args.ip.as_deref(), args.port) else {
        bail!("missing <ip> <port> of the receiver (see --help)");
    };
    let peer = resolve_peer(ip, port)?;
    let human = Human {
        to_stderr: args.json,
    };
    let size = usize::try_from(args.size).context("--size does not fit this machine")?;
    // --raw sends the whole buffer as one message: a staging ring then has one slot of it.
    let chunk = if args.raw {
        args.size
    } else {
        args.chunk.min(args.size)
    };
    let chunk = usize::try_from(chunk).context("--chunk does not fit")?;
    let chosen = transport::choose_here(args.transport, Some(peer), args.timeout);
    if let Some(note) = &chosen.note {
        eprintln!("note: {note}");
    }
    let tcp = chosen.kind == TransportKind::Tcp;
    let mem = if tcp {
        super::tcp::send_mem(args)?
    } else {
        args.mem
    };
    let gpu = GpuChoice::open(args.gpu, mem)?;
    let facts = path_facts(&gpu, args.nic.as_deref(), args.gpudirect_level, args.size)?;
    let mut plan = plan(Direction::Send, mem, &facts)?;
    if tcp {
        plan = transport::tcp::tcp_plan(&plan);
    }
    let mut memory = SendMemory::new(plan, gpu, size, chunk);
    let cfg = SendConfig {
        peer,
        op: args.op,
        bytes: args.size,
        nic: args.nic.clone(),
        chunk: args.chunk,
        depth: args.depth,
        timeout: args.timeout,
        busy_poll: args.busy_poll,
        progress: !args.json && std::io::stderr().is_terminal(),
        protocol_version: args.protocol_version,
        key: args
            .key_file
            .as_deref()
            .map(host::server::Key::from_file)
            .transpose()?,
    };

    let mut reports: Vec<SendReport> = Vec::new();
    if tcp {
        reports = super::tcp::send(args, &cfg, &mut memory)?;
    } else if args.reuse_connection {
        // All iterations on one connection: one call, one report per transfer.
        reports = rdma::send_repeated(&cfg, &mut memory, args.iters)?;
    } else {
        for i in 0..args.iters {
            let result = if args.raw {
                rdma::send_raw(&cfg, &mut memory)
            } else {
                rdma::send(&cfg, &mut memory)
            };
            let report = result.map_err(|e| iteration_error(e, i, args.iters))?;
            reports.push(report);
        }
    }

    let verified = reports.iter().all(|r| r.receiver.is_none_or(|v| v.ok()));
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let seconds: f64 = reports.iter().map(|r| r.seconds).sum();
    let gbps = transfer::gigabytes_per_second(bytes, seconds);

    let Some(source) = memory.settled() else {
        bail!("no transfer was made");
    };
    let path = source.path();
    let first_values = source.first_values(5)?;
    let memory_log = reports
        .first()
        .map(|r| r.memory.clone())
        .unwrap_or_default();
    // Notes only where the path was not simply what was asked (`--gpu none`, `--mem host`).
    let asked_for_host = args.gpu == GpuSelection::None || args.mem == MemKind::Host;
    if !asked_for_host {
        for note in memory_notes(&memory_log) {
            eprintln!("note: {note}");
        }
    }
    let via = if tcp {
        transport::tcp::describe(path)
    } else {
        path.describe()
    };
    human.line(format!("Data sent successfully via {via}"));
    human.line(values_line(&first_values));
    let n = reports.len();
    for (i, r) in reports.iter().enumerate() {
        let prefix = if n > 1 {
            format!("iteration {}/{n}: ", i + 1)
        } else {
            String::new()
        };
        let how = match r.op {
            "raw" => "one SEND_WITH_IMM (imm 0x1234)".to_string(),
            op => format!(
                "{}{} in {} chunk{} of {}, {} in flight",
                op.to_uppercase(),
                if tcp {
                    format!(
                        " over {} stream{}",
                        args.streams,
                        if args.streams == 1 { "" } else { "s" }
                    )
                } else {
                    String::new()
                },
                r.chunks,
                if r.chunks == 1 { "" } else { "s" },
                format_bytes(r.chunk_bytes),
                r.in_flight
            ),
        };
        human.line(format!(
            "{prefix}{} to {} by {how}: {:.6} s, {:.3} GB/s (connection setup {:.3} s)",
            format_bytes(r.bytes),
            r.peer,
            r.seconds,
            r.gbps,
            r.connect_seconds
        ));
        if let Some(v) = &r.receiver {
            human.line(format!("{prefix}Receiver: {}", verdict_words(v)));
        }
        if r.op == "raw" {
            human.line(match r.raw_reply_bytes {
                Some(b) => format!("{prefix}Reply: {b} bytes"),
                None => format!("{prefix}Reply: none within 1 s"),
            });
        }
    }
    if n > 1 {
        human.line(format!(
            "aggregate: {n} transfers, {} in {seconds:.6} s of data time: {gbps:.3} GB/s",
            format_bytes(bytes)
        ));
    }
    let round_trip = RoundTrips::of(&reports);
    if args.reuse_connection {
        if let Some(rt) = &round_trip {
            let verify = rt
                .verify_median_us
                .map(|v| format!("; receiver's verification median {v:.1} us"))
                .unwrap_or_default();
            human.line(format!(
                "round trip (first work request to the receiver's verdict), {} transfer{} on one connection: median {:.1} us, min {:.1} us, mean {:.1} us, max {:.1} us{verify}",
                rt.transfers,
                if rt.transfers == 1 { "" } else { "s" },
                rt.median_us,
                rt.min_us,
                rt.mean_us,
                rt.max_us
            ));
        }
    }
    if args.json {
        println!(
            "{}",
            json!({
                "ok": verified,
                "peer": peer.to_string(),
                "op": if args.raw { "raw" } else { args.op.name() },
                "transport": chosen.kind,
                "streams": tcp.then_some(args.streams),
                "path": path,
                "path_description": path.describe(),
                "memory": memory_log,
                "bytes": args.size,
                "first_values": first_values,
                "iterations": reports,
                "aggregate": {
                    "transfers": n,
                    "bytes": bytes,
                    "seconds": seconds,
                    "gbps": gbps,
                },
                "reuse_connection": args.reuse_connection,
                "round_trip": round_trip,
            })
        );
    }
    if !verified {
        eprintln!("error: the receiver's verification failed");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Round-trip statistics over the iterations (microseconds).
#[derive(Debug, serde::Serialize)]
struct RoundTrips {
    transfers: usize,
    median_us: f64,
    min_us: f64,
    mean_us: f64,
    max_us: f64,
    /// The receiver's verification time, as it reported it (receivers report it only
    /// with --reuse-connection).
    verify_median_us: Option<f64>,
}

impl RoundTrips {
    fn of(reports: &[SendReport]) -> Option<RoundTrips> {
        let mut rts: Vec<f64> = reports
            .iter()
            .filter_map(|r| r.round_trip_seconds.map(|s| s * 1e6))
            .collect();
        if rts.is_empty() {
            return None;
        }
        let mut verify: Vec<f64> = reports
            .iter()
            .filter_map(|r| r.receiver_verify_seconds.map(|s| s * 1e6))
            .collect();
        Some(RoundTrips {
            transfers: rts.len(),
            median_us: median(&mut rts),
            min_us: rts.iter().copied().fold(f64::INFINITY, f64::min),
            mean_us: rts.iter().sum::<f64>() / rts.len() as f64,
            max_us: rts.iter().copied().fold(0.0, f64::max),
            verify_median_us: (!verify.is_empty()).then(|| median(&mut verify)),
        })
    }
}

/// The median (the lower middle for an even count); sorts `values`.
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

fn verdict_words(v: &transfer::ReceiverVerdict) -> String {
    match (v.status, &v.verification) {
        (AckStatus::VerifyFailed, _) | (_, None) => format!(
            "received {} but could not verify it (see the receiver's log)",
            format_bytes(v.received_bytes)
        ),
        (_, Some(ver)) => format!(
            "verified {}: {}",
            format_bytes(v.received_bytes),
            verification_words(ver)
        ),
    }
}
