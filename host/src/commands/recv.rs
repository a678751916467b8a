//! `host recv`: serve senders, verify each transfer, report.

use super::facts::{memory_notes, path_facts};
use super::output::{integrity_lines, is_user_data, values_line, verification_words, Human};
use anyhow::{bail, Result};
use host::cli::RecvArgs;
use host::engine::serve::{
    admission_of, serve_verbs as serve_verbs_on, SinkFactoryMaker, VerbsServe,
};
use host::engine::RecvMemory;
use host::memory::DataPath;
use host::memory_factory::{GpuChoice, GpuSelection, SinkFactory};
use host::memory_path::{plan, Attempt, AttemptLog, Direction, MemKind, Method, Plan};
use host::server::admission::{Admission, Limits};
use host::transfer::{RecvOutcome, RecvReport};
use host::transport::TransportKind;
use host::units::format_bytes;
use serde_json::json;
use std::process::ExitCode;
use std::sync::Arc;

/// The receiver's words for where data lands.
fn sink_words(path: DataPath) -> &'static str {
    match path {
        DataPath::HostMemory => "host memory",
        DataPath::GpuDirectRdma => "GPU memory (GPUDirect RDMA)",
        DataPath::GpuMappedHostMemory => "GPU-mapped host memory",
        DataPath::StagedThroughHostMemory => "host memory, staged to the GPU",
    }
}

/// `json_out`: JSON lines on stdout; human lines then go to stderr, as they do when the
/// data itself goes to stdout (`--output -`: `data_out`).
pub(super) fn print_outcome(outcome: &RecvOutcome, json_out: bool, data_out: bool) {
    let human = Human {
        to_stderr: json_out || data_out,
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
        RecvOutcome::Notice { text } => {
            eprintln!("receiver: {text}");
            if json_out {
                println!("{}", json!({ "event": "notice", "text": text }));
            }
        }
        RecvOutcome::Completed(r) => {
            if r.memory
                .attempts
                .iter()
                .any(|a| matches!(a, Attempt::Refused { .. }))
            {
                for note in memory_notes(&r.memory) {
                    eprintln!("note: {note}");
                }
            }
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
        if r.bytes < 1024 || is_user_data(&r.integrity) {
            format!("{} bytes", r.bytes)
        } else {
            format_bytes(r.bytes)
        },
        r.peer,
        sink_words(r.path),
        r.seconds,
        r.gbps
    ));
    if let Some(striped) = &r.striped {
        human.line(super::output::received_rails_line(striped));
    }
    if r.transfers < r.offered {
        human.line(format!(
            "only {} of the {} transfers offered on this connection were done: not ok",
            r.transfers, r.offered
        ));
    }
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
    for line in integrity_lines(&r.integrity) {
        human.line(line);
    }
    if !r.first_values.is_empty() && !is_user_data(&r.integrity) {
        human.line(values_line(&r.first_values));
    }
    if !r.reply_delivered {
        human.line("warning: the sender left before our verdict reached it");
    }
}

/// Where received data goes: the plan from the GPU's and the NIC's facts, refined per
/// connection by what the NIC really registers. Each connection's thread makes its own
/// factory from it (GPU objects stay on the thread that made them), opening the GPU only
/// where the plan may put data there.
fn sink_factory_maker(args: &RecvArgs) -> Result<Arc<SinkFactoryMaker>> {
    let plan = sink_plan(args)?;
    let (gpu, mem) = (args.gpu, args.mem);
    let needs_gpu = plan.attempts.iter().any(|m| m.is_gpudirect());
    Ok(Arc::new(move || {
        let selection = if needs_gpu { gpu } else { GpuSelection::None };
        Ok(SinkFactory::new(
            plan.clone(),
            GpuChoice::open(selection, mem)?,
        ))
    }))
}

/// The receiver's plan, decided once on the main thread (which opens the GPU only for
/// its facts).
fn sink_plan(args: &RecvArgs) -> Result<Plan> {
    let gpu = GpuChoice::open(args.gpu, args.mem)?;
    let facts = path_facts(
        &gpu,
        args.nic.as_deref(),
        args.gpudirect_level,
        args.max_bytes,
    )?;
    #[allow(unused_mut)]
    let mut plan = plan(Direction::Recv, args.mem, &facts)?;
    #[cfg(feature = "cuda")]
    refuse_unordered_writes(&gpu, args.mem, &mut plan)?;
    let left_out = AttemptLog::left_out(&plan);
    // Notes only where the path was not simply what was asked (`--gpu none`, `--mem host`).
    if args.gpu != GpuSelection::None && args.mem != MemKind::Host {
        for line in left_out.lines() {
            eprintln!("note: {line}");
        }
        if plan.attempts.first() == Some(&Method::Host) && !plan.left_out.is_empty() {
            eprintln!("note: receiving into host memory");
        }
    }
    Ok(plan)
}

/// A GPU that may see the NIC's writes out of order and cannot flush them cannot have
/// received data verified in its memory: no GPUDirect receive there.
#[cfg(feature = "cuda")]
fn refuse_unordered_writes(
    gpu: &GpuChoice,
    mem: MemKind,
    plan: &mut host::memory_path::Plan,
) -> Result<()> {
    use host::gpu::capabilities::{writes_visibility, WritesVisibility};
    let Some(device) = gpu.raw_device() else {
        return Ok(());
    };
    if writes_visibility(device) != WritesVisibility::Unordered {
        return Ok(());
    }
    let why = "this GPU may see the NIC's writes out of order and offers no flush (cuFlushGPUDirectRDMAWrites)";
    if mem == MemKind::Device {
        anyhow::bail!("--mem device: {why}, so received data cannot be verified in its memory; use --mem host");
    }
    for method in plan.attempts.iter().filter(|m| m.is_gpudirect()) {
        plan.left_out.push(host::memory_path::LeftOut {
            method: *method,
            why: why.to_string(),
        });
    }
    plan.attempts.retain(|m| !m.is_gpudirect());
    Ok(())
}

pub fn run(args: &RecvArgs) -> Result<ExitCode> {
    let chosen = host::transport::choose_here(args.transport, None, args.timeout);
    if let Some(note) = &chosen.note {
        eprintln!("note: {note}");
    }
    let json_out = args.json;
    let data_out = args.output.as_deref() == Some("-");
    if json_out && data_out {
        bail!("--json and --output - would both write to standard output: choose one");
    }
    let auto = args.transport == host::transport::TransportKind::Auto;
    let verified = match chosen.kind {
        TransportKind::Rdma if args.key_file.is_some() && args.raw => {
            bail!("--key-file needs the framed protocol (the proof follows the header); drop --raw")
        }
        // A sender whose auto choice fell back to TCP (no RDMA route to here) finds this
        // receiver too: both listen, under one admission.
        TransportKind::Rdma if auto && !args.raw => serve_both(args)?,
        TransportKind::Rdma => serve_verbs(args, None)?,
        _ => super::tcp::serve(args, &mut |o| print_outcome(o, json_out, data_out))?,
    };
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The verbs receiver, under its own admission or a shared one.
fn serve_verbs(args: &RecvArgs, admission: Option<&Arc<Admission>>) -> Result<bool> {
    let opts = super::tcp::recv_options(args)?;
    let memory = RecvMemory::Plan(sink_factory_maker(args)?);
    let json_out = args.json;
    let data_out = args.output.as_deref() == Some("-");
    let mut report = |o: &RecvOutcome| print_outcome(o, json_out, data_out);
    let how = VerbsServe {
        raw: args.raw,
        busy_poll: args.busy_poll,
    };
    let own;
    let admission = match admission {
        Some(a) => a,
        None => {
            own = admission_of(&opts);
            &own
        }
    };
    Ok(serve_verbs_on(
        &opts,
        how,
        &memory,
        admission,
        None,
        &mut report,
    )?)
}

/// `--transport auto` with an RDMA device: verbs and TCP on the same port number, each on
/// a thread of its own, under one admission (connections, bytes, per address). The first
/// to end with `--once`, or verbs with an error, ends the receiver; TCP failing to listen
/// (its port taken by another program) leaves verbs serving, with a note.
fn serve_both(args: &RecvArgs) -> Result<bool> {
    let limits = Limits::receiver(
        args.once,
        args.max_connections as usize,
        args.max_memory,
        args.max_per_peer(),
    );
    let admission = Admission::new(limits);
    let (done, ended) = std::sync::mpsc::channel::<(TransportKind, Result<bool>)>();
    let spawn = |kind: TransportKind, serve: Box<dyn FnOnce() -> Result<bool> + Send>| {
        let done = done.clone();
        std::thread::Builder::new()
            .name(format!("{kind:?} receiver"))
            .spawn(move || {
                let _ = done.send((kind, serve()));
            })
            .map(drop)
    };
    let (tcp_args, tcp_admission) = (args.clone(), admission.clone());
    spawn(
        TransportKind::Tcp,
        Box::new(move || {
            let json_out = tcp_args.json;
            let data_out = tcp_args.output.as_deref() == Some("-");
            super::tcp::serve_with(&tcp_args, &tcp_admission, &mut |o| {
                match o {
                // Said once it is true, and told apart from the verbs listener's line.
                RecvOutcome::Listening { addr } => eprintln!(
                    "receiver: also listening on {addr} (TCP, for senders without an RDMA route here)"
                ),
                other => print_outcome(other, json_out, data_out),
            }
            })
        }),
    )?;
    let verbs_args = args.clone();
    spawn(
        TransportKind::Rdma,
        Box::new(move || serve_verbs(&verbs_args, Some(&admission))),
    )?;
    drop(done);
    loop {
        match ended.recv() {
            Ok((TransportKind::Tcp, Err(e))) => {
                eprintln!("note: --transport auto: TCP not served too: {e:#}");
            }
            Ok((_, result)) => return result,
            Err(_) => anyhow::bail!("both receivers ended without a word"),
        }
    }
}
