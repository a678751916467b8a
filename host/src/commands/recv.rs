//! `host recv`: serve senders, verify each transfer, report.

use super::output::{values_line, verification_words, Human};
use anyhow::Result;
use host::cli::RecvArgs;
use host::memory::{DataPath, SinkFactory};
use host::transfer::units::format_bytes;
use host::transfer::{self, RecvConfig, RecvOutcome, RecvReport};
use serde_json::json;
use std::net::SocketAddr;
use std::process::ExitCode;

/// The receiver's words for where data lands.
fn sink_words(path: DataPath) -> &'static str {
    match path {
        DataPath::HostMemory => "host memory",
        DataPath::GpuDirectRdma => "GPU memory (GPUDirect RDMA)",
        DataPath::GpuMappedHostMemory => "GPU-mapped host memory",
        DataPath::StagedThroughHostMemory => "host memory, staged to the GPU",
    }
}

fn print_outcome(outcome: &RecvOutcome, json_out: bool) {
    let human = Human {
        to_stderr: json_out,
    };
    match outcome {
        RecvOutcome::Listening { addr } => {
            eprintln!("receiver: listening on {addr}");
            if json_out {
                println!("{}", json!({ "event": "listening", "addr": addr }));
            }
        }
        RecvOutcome::Rejected { peer, reason } => {
            eprintln!("receiver: rejected {peer}: {reason}");
            if json_out {
                println!(
                    "{}",
                    json!({ "event": "rejected", "peer": peer, "reason": reason })
                );
            }
        }
        RecvOutcome::Failed { peer, error } => {
            eprintln!("error: {error}");
            if json_out {
                println!(
                    "{}",
                    json!({ "event": "failed", "peer": peer, "error": error })
                );
            }
        }
        RecvOutcome::Completed(r) => {
            print_report(r, &human);
            if json_out {
                println!(
                    "{}",
                    json!({ "event": "completed", "ok": r.ok(), "report": r })
                );
            }
        }
    }
}

fn print_report(r: &RecvReport, human: &Human) {
    let imm = r
        .imm
        .map(|i| format!(" with immediate {i:#x}"))
        .unwrap_or_default();
    let how = if r.op == "raw" {
        format!("one message{imm} (raw)")
    } else {
        format!(
            "{} ({} chunk{})",
            r.op.to_uppercase(),
            r.chunks,
            if r.chunks == 1 { "" } else { "s" }
        )
    };
    human.line(format!(
        "received {} from {} by {how} into {}: {:.6} s, {:.3} GB/s",
        if r.bytes < 1024 {
            format!("{} bytes", r.bytes)
        } else {
            format_bytes(r.bytes)
        },
        r.peer,
        sink_words(r.path),
        r.seconds,
        r.gbps
    ));
    if r.transfers > 1 {
        human.line(format!(
            "{} transfers of {} on one connection, each verified before its ack ({:.6} s verifying in all)",
            r.transfers,
            format_bytes(r.bytes / r.transfers as u64),
            r.verify_seconds
        ));
    }
    match (&r.verification, &r.verify_error) {
        (Some(v), _) => human.line(format!("verification: {}", verification_words(v))),
        (None, Some(e)) => human.line(format!("verification failed: {e}")),
        (None, None) => {}
    }
    if !r.first_values.is_empty() {
        human.line(values_line(&r.first_values));
    }
    if !r.reply_delivered {
        human.line("warning: the sender left before our verdict reached it");
    }
}

pub fn run(args: &RecvArgs) -> Result<ExitCode> {
    let cfg = RecvConfig {
        bind: SocketAddr::new(args.bind, args.port),
        once: args.once,
        raw: args.raw,
        max_bytes: args.max_bytes,
        timeout: args.timeout,
        busy_poll: args.busy_poll,
    };
    let factory = SinkFactory::new(args.mem, args.gpu)?;
    let mut make_sink = |len: usize| factory.make(len);
    let json_out = args.json;
    let verified = transfer::serve(&cfg, &mut make_sink, &mut |o| print_outcome(o, json_out))?;
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
