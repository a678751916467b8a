//! `host <ip> <port>`: generate the data, send it, report the receiver's verdict.

use super::facts::{memory_notes, path_facts};
use super::output::{
    integrity_lines, is_user_data, iteration_error, values_line, verification_words, Human,
};
use super::peer::{resolve_all, resolve_peer};
use anyhow::{bail, Context, Result};
use host::cli::{SendArgs, Streams};
use host::engine::connect::send_verbs;
use host::engine::Cooldowns;
use host::engine::{SendOptions, VerbsSendOptions};
use host::memory::HostBuffer;
use host::memory_factory::{GpuChoice, GpuSelection, SendMemory};
use host::memory_path::{plan, AttemptLog, Direction, MemKind};
use host::net::tcp::streams::{choose_streams, StreamFacts};
use host::net::verbs::dial::RailTarget;
use host::net::verbs::raw::send_raw;
use host::transfer::faults::FaultInjector;
use host::transfer::{self, PayloadOptions, SendReport};
use host::transport::{self, TransportKind};
use host::units::format_bytes;
use host::wire::AckStatus;
use host::wire::{checked_name, Payload, VerifyMode};
use serde_json::json;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;

/// The RDMA device the route to `peer` leaves through: known already when
/// `--transport auto` resolved it; else asked of the RDMA CM, but only where its facts
/// matter (a GPU is in use). `None` when it cannot be told: the transfer's own
/// resolution then reports why.
fn route_device(
    chosen: &transport::Chosen,
    gpu: &GpuChoice,
    peer: SocketAddr,
    timeout: std::time::Duration,
) -> Option<String> {
    if chosen.route_device.is_some() {
        return chosen.route_device.clone();
    }
    if gpu.caps.is_err() {
        return None;
    }
    // A resolution that works takes milliseconds; one that does not is the transfer's
    // to report, so this one is not allowed to double the wait.
    host::net::verbs::open::reachable(peer, timeout.min(std::time::Duration::from_secs(2)))
        .ok()
        .flatten()
}

/// What is sent and how the receiver checks it, from the options (`user_data`: an
/// --input was given).
pub fn payload_options(args: &SendArgs) -> Result<PayloadOptions> {
    let payload = match args.input {
        Some(_) => Payload::Opaque,
        None => Payload::Pattern,
    };
    let verify = args.verify.unwrap_or(VerifyMode::default_for(payload));
    if payload == Payload::Opaque && verify.pattern() {
        bail!(
            "--verify {}: the pattern check applies to the built-in pattern, not to --input; use --verify checksum or off",
            verify.name()
        );
    }
    let faults = args
        .test_inject_faults
        .as_deref()
        .map(FaultInjector::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let name = args.name.clone().or_else(|| {
        args.input
            .as_deref()
            .and_then(transfer::input::default_name)
    });
    if let Some(n) = &name {
        checked_name(n.as_bytes()).map_err(|e| anyhow::anyhow!("--name {n:?}: {e}"))?;
    }
    if let Some(f) = &faults {
        eprintln!(
            "warning: TEST FAULT INJECTION: one bit flipped in about one chunk in {} after its checksum (--test-inject-faults); the data on the wire is corrupted on purpose",
            f.one_in
        );
    }
    Ok(PayloadOptions {
        payload,
        verify,
        max_resends: args.max_resends,
        name,
        faults,
    })
}

/// Where a command's transfers go: the transport chosen, the receiver, the first rail's
/// device and (verbs) the rails to stripe over, and where failed rails rest (one value
/// for the whole command, so a `--sweep` remembers).
#[derive(Clone, Copy)]
struct Route<'a> {
    chosen: &'a transport::Chosen,
    peer: SocketAddr,
    rail: Option<&'a str>,
    stripe: &'a [RailTarget],
    cooldowns: &'a Cooldowns,
}

/// `--warmup` + `--iters` transfers of `bytes` each (on one connection with
/// `--reuse-connection`, else a connection each): the reports of the measured ones
/// (the warm-up transfers are made and verified, then dropped) and the memory they were
/// sent from.
fn measure(
    args: &SendArgs,
    bytes: u64,
    route: &Route<'_>,
    user_data: Option<HostBuffer>,
) -> Result<(Vec<SendReport>, SendMemory)> {
    let Route {
        chosen,
        peer,
        rail,
        stripe,
        cooldowns,
    } = *route;
    let bytes = user_data.as_ref().map_or(bytes, |d| d.len() as u64);
    let tcp = chosen.kind == TransportKind::Tcp;
    let size = usize::try_from(bytes).context("--size does not fit this machine")?;
    // --raw sends the whole buffer as one message: a staging ring then has one slot of it.
    let chunk = if args.raw {
        bytes
    } else {
        args.chunk.min(bytes)
    };
    let chunk = usize::try_from(chunk).context("--chunk does not fit")?;
    let mem = args.mem;
    let gpu = GpuChoice::open(args.gpu, mem)?;
    // The NIC whose facts decide the memory path: the first rail of --nic or --rails
    // (`rail`), else the device the route to the receiver leaves through (as the RDMA CM
    // resolves it), else the nearest to the GPU. Over TCP no NIC reads the memory.
    let nic = if tcp {
        None
    } else {
        rail.map(str::to_string)
            .or_else(|| route_device(chosen, &gpu, peer, args.timeout))
    };
    let facts = path_facts(&gpu, nic.as_deref(), args.gpudirect_level, bytes)?;
    let mut plan = plan(Direction::Send, mem, &facts)?;
    if tcp {
        plan = host::engine::connect::tcp_plan(&plan);
    }
    let mut memory = match user_data {
        Some(data) => SendMemory::user(plan, gpu, data, chunk),
        None => SendMemory::new(plan, gpu, size, chunk),
    };
    let payload = payload_options(args)?;
    let key = args
        .key_file
        .as_deref()
        .map(host::server::Key::from_file)
        .transpose()?;
    let mut stripe = stripe.to_vec();
    if stripe.len() > 1 {
        if let Some(why) = why_not_striped(args, key.is_some()) {
            eprintln!(
                "note: {} rails given, but {why}: this transfer uses the first rail only (to {peer})",
                stripe.len(),
            );
            stripe.clear();
        }
    }
    let opts = SendOptions {
        peer,
        chunk: args.chunk,
        depth: args.depth,
        timeout: args.timeout,
        progress: !args.json && args.sweep.is_none() && std::io::stderr().is_terminal(),
        protocol_version: args.protocol_version,
        key,
        payload: payload.clone(),
        rail_timeout: args.rail_timeout,
        cooldowns: cooldowns.clone(),
        tcp: Default::default(),
        verbs: VerbsSendOptions {
            op: args.op,
            nic: rail.map(str::to_string),
            rails: stripe,
            busy_poll: args.busy_poll,
            test_peer_lies: args.test_peer_lies,
        },
        cancel: None,
    };
    if let Some(lie) = args.test_peer_lies {
        eprintln!("warning: TEST PEER LIES: this sender breaks the verbs protocol on purpose ({lie:?}, --test-peer-lies); the receiver has to refuse it");
    }

    let transfers = args.warmup.checked_add(args.iters).with_context(|| {
        format!(
            "--warmup {} and --iters {} make more than {} transfers",
            args.warmup,
            args.iters,
            u32::MAX
        )
    })?;
    let mut reports: Vec<SendReport> = Vec::new();
    if tcp {
        note_streams_once(args);
        reports = super::tcp::send(args, opts, &mut memory, transfers)?;
    } else if args.raw && payload.payload != Payload::Pattern {
        bail!("--raw sends the pattern only (no header says what the bytes are): drop --input");
    } else if args.reuse_connection {
        // All iterations on one connection: one call, one report per transfer.
        reports = send_verbs(&opts, &mut memory, transfers)?;
    } else {
        for i in 0..transfers {
            let result = if args.raw {
                send_raw(peer, rail, &mut memory, bytes, args.timeout, args.busy_poll)
            } else {
                send_verbs(&opts, &mut memory, 1).map(|mut r| r.remove(0))
            };
            let report = result.map_err(|e| iteration_error(e, i, transfers))?;
            reports.push(report);
        }
    }
    // The warm-up transfers were made and verified like the others; they are not counted.
    let mut measured = reports.split_off((args.warmup as usize).min(reports.len()));
    // The memory path's log is carried by a connection's first report only.
    if let (Some(warm), Some(first)) = (reports.first(), measured.first_mut()) {
        if first.memory == AttemptLog::default() {
            first.memory = warm.memory.clone();
        }
    }
    Ok((measured, memory))
}

/// Why a transfer with several verbs rails goes over the first alone, if it does (the
/// CLI says so in one line).
fn why_not_striped(args: &SendArgs, keyed: bool) -> Option<&'static str> {
    if args.raw {
        Some("--raw sends one message")
    } else if keyed {
        // A further rail's join carries no proof of the key, so a receiver with a key
        // refuses it: the first rail alone proves it.
        Some("--key-file is not striped over verbs (a further rail's join cannot prove the key; TCP's streams can)")
    } else {
        None
    }
}

/// The rails of a verbs transfer: rail k from the k-th device of `--nic`/`--rails` (if
/// named) to the k-th receiver address of `<IP>` (a comma list). Fewer than two
/// addresses: not striped, and a set of several rails is said in one line to carry the
/// transfer on its first.
fn verbs_rails(ip: &str, port: u16, set: &[host::rails::RailId]) -> Result<Vec<RailTarget>> {
    let addrs = resolve_all(ip, port)?;
    if addrs.len() < 2 {
        if let Some(note) = host::rails::several_rails_note(set) {
            eprintln!("note: {note}");
        }
        return Ok(Vec::new());
    }
    if !set.is_empty() && set.len() != addrs.len() {
        bail!(
            "{} receiver addresses and {} rails (--nic/--rails): rail k goes from the k-th device to the k-th address; give as many of each",
            addrs.len(),
            set.len()
        );
    }
    Ok(addrs
        .into_iter()
        .enumerate()
        .map(|(k, peer)| RailTarget {
            peer,
            nic: set.get(k).map(|r| r.device.clone()),
        })
        .collect())
}

/// A rate for people: GB/s (10^9 bytes/s), or Gb/s (10^9 bits/s) with --report-gbits.
fn rate_words(gb_per_s: f64, gbits: bool) -> String {
    if gbits {
        format!("{:.3} Gb/s", gb_per_s * 8.0)
    } else {
        format!("{gb_per_s:.3} GB/s")
    }
}

pub fn run(args: &SendArgs) -> Result<ExitCode> {
    let (Some(ip), Some(port)) = (args.ip.as_deref(), args.port) else {
        bail!("missing <ip> <port> of the receiver (see --help)");
    };
    let peer = resolve_peer(ip, port)?;
    let human = Human {
        to_stderr: args.json,
    };
    let chosen = transport::choose_here(args.transport, Some(peer), args.timeout);
    if let Some(note) = &chosen.note {
        eprintln!("note: {note}");
    }
    let tcp = chosen.kind == TransportKind::Tcp;
    let args = &with_streams(args, peer, tcp);
    if tcp {
        super::tcp::check_send_options(args, chosen.note.as_deref())?;
    } else if !args.bind_interfaces.is_empty() {
        bail!("--bind-interfaces stripes a transfer over TCP rails; RDMA rails are --nic a,b with one receiver address each (<IP> a comma list): add --transport tcp, or drop it");
    }
    let set = super::rails::sender_rails(args, tcp)?;
    let rail = set.first().map(|r| r.device.clone());
    let stripe = if tcp {
        Vec::new()
    } else {
        verbs_rails(ip, port, &set)?
    };
    let cooldowns = Cooldowns::new();
    let route = Route {
        chosen: &chosen,
        peer,
        rail: rail.as_deref(),
        stripe: &stripe,
        cooldowns: &cooldowns,
    };
    if let Some(sweep) = args.sweep {
        return run_sweep(args, sweep, &route, &human);
    }
    let user_data = args
        .input
        .as_deref()
        .map(transfer::input::read_input)
        .transpose()?;
    let (reports, memory) = measure(args, args.size, &route, user_data)?;
    if args.warmup > 0 {
        human.line(format!(
            "warm-up: {} transfer{} made and verified first, not counted below",
            args.warmup,
            if args.warmup == 1 { "" } else { "s" }
        ));
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
    let user_data = memory.is_user_data();
    let via = if tcp {
        host::net::tcp::describe(path, user_data)
    } else {
        path.describe()
    };
    human.line(format!("Data sent successfully via {via}"));
    if !user_data {
        human.line(values_line(&first_values));
    }
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
                "{} in {} chunk{} of {}, {} in flight",
                if tcp {
                    let rails = match r.rails.len() {
                        0 | 1 => String::new(),
                        n => format!("{n} rails of "),
                    };
                    format!(
                        "TCP over {rails}{} stream{}",
                        args.streams,
                        if args.streams == 1 { "" } else { "s" }
                    )
                } else if r.rails.iter().filter(|x| x.chunks > 0).count() > 1 {
                    let carrying = r.rails.iter().filter(|x| x.chunks > 0).count();
                    format!("{} over {carrying} rails", op.to_uppercase())
                } else {
                    op.to_uppercase()
                },
                r.chunks,
                if r.chunks == 1 { "" } else { "s" },
                format_bytes(r.chunk_bytes),
                r.in_flight
            ),
        };
        human.line(format!(
            "{prefix}{} to {} by {how}: {:.6} s, {} (connection setup {:.3} s)",
            format_bytes(r.bytes),
            r.peer,
            r.seconds,
            rate_words(r.gbps, args.report_gbits),
            r.connect_seconds
        ));
        if let Some(v) = &r.receiver {
            human.line(format!(
                "{prefix}Receiver: {}",
                verdict_words(v, is_user_data(&r.integrity))
            ));
        }
        for line in integrity_lines(&r.integrity) {
            human.line(format!("{prefix}{line}"));
        }
        for line in super::output::rail_lines(&r.rails) {
            human.line(format!("{prefix}{line}"));
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
            "aggregate: {n} transfers, {} in {seconds:.6} s of data time: {}",
            format_bytes(bytes),
            rate_words(gbps, args.report_gbits)
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
                "round trip (first chunk out to the receiver's verdict), {} transfer{} on one connection: {}{verify}",
                rt.transfers,
                if rt.transfers == 1 { "" } else { "s" },
                rt.words()
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
                "path_description": via,
                "memory": memory_log,
                "bytes": args.size,
                "first_values": first_values,
                "iterations": reports,
                "aggregate": {
                    "transfers": n,
                    "bytes": bytes,
                    "seconds": seconds,
                    "gb_per_s": gbps,
                    "gbit_per_s": gbps * 8.0,
                },
                "warmup": args.warmup,
                "reuse_connection": args.reuse_connection,
                "round_trip": round_trip,
            })
        );
    }
    if !verified {
        let not_stored = reports
            .iter()
            .any(|r| r.receiver.is_some_and(|v| v.status == AckStatus::NotStored));
        match not_stored {
            true => eprintln!("error: the receiver could not store the data (see its log)"),
            false => eprintln!("error: the receiver's verification failed"),
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Round-trip statistics over the iterations (microseconds). The percentiles are
/// nearest-rank: p99 of 1000 round trips is the 990th smallest.
#[derive(Debug, serde::Serialize)]
struct RoundTrips {
    transfers: usize,
    median_us: f64,
    min_us: f64,
    mean_us: f64,
    max_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p99_9_us: f64,
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
        let median_us = median(&mut rts);
        Some(RoundTrips {
            transfers: rts.len(),
            median_us,
            p50_us: percentile(&rts, 50.0),
            p90_us: percentile(&rts, 90.0),
            p99_us: percentile(&rts, 99.0),
            p99_9_us: percentile(&rts, 99.9),
            min_us: rts.iter().copied().fold(f64::INFINITY, f64::min),
            mean_us: rts.iter().sum::<f64>() / rts.len() as f64,
            max_us: rts.iter().copied().fold(0.0, f64::max),
            verify_median_us: (!verify.is_empty()).then(|| median(&mut verify)),
        })
    }
}

impl RoundTrips {
    /// "p50 310.2 us, p90 ..., min ..., mean ..., max ..."
    fn words(&self) -> String {
        format!(
            "p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, min {:.1} us, mean {:.1} us, max {:.1} us",
            self.p50_us, self.p90_us, self.p99_us, self.p99_9_us, self.min_us, self.mean_us, self.max_us
        )
    }
}

/// The nearest-rank percentile `p` (0 < p <= 100) of `sorted` (ascending): the
/// smallest value with at least p% of the values at or below it.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // (The small margin keeps 99.9% of 1000 at rank 999, not 1000 through rounding.)
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `--sweep MIN..MAX`: every power of two from MIN to MAX, `--iters` transfers of each
/// (after `--warmup`), one connection per size with `--reuse-connection` (a connection
/// offers one size); a table for people, one JSON object with every size.
fn run_sweep(
    args: &SendArgs,
    (min, max): (u64, u64),
    route: &Route<'_>,
    human: &Human,
) -> Result<ExitCode> {
    let sizes = sweep_sizes(min, max);
    let unit = if args.report_gbits { "Gb/s" } else { "GB/s" };
    human.line(format!(
        "{:>10} {:>6} {:>12} {:>12} {:>12} {:>12}",
        "bytes", "iters", unit, "p50 us", "p99 us", "max us"
    ));
    let mut rows = Vec::new();
    let mut verified = true;
    for bytes in sizes {
        let (reports, _memory) = measure(args, bytes, route, None)
            .with_context(|| format!("--sweep at {}", format_bytes(bytes)))?;
        verified &= reports.iter().all(|r| r.receiver.is_none_or(|v| v.ok()));
        let total: u64 = reports.iter().map(|r| r.bytes).sum();
        let seconds: f64 = reports.iter().map(|r| r.seconds).sum();
        let gbps = transfer::gigabytes_per_second(total, seconds);
        let rt = RoundTrips::of(&reports);
        let cell = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        human.line(format!(
            "{:>10} {:>6} {:>12.3} {:>12} {:>12} {:>12}",
            bytes,
            reports.len(),
            if args.report_gbits { gbps * 8.0 } else { gbps },
            cell(rt.as_ref().map(|r| r.p50_us)),
            cell(rt.as_ref().map(|r| r.p99_us)),
            cell(rt.as_ref().map(|r| r.max_us)),
        ));
        rows.push(json!({
            "bytes": bytes,
            "transfers": reports.len(),
            "seconds": seconds,
            "gb_per_s": gbps,
            "gbit_per_s": gbps * 8.0,
            "round_trip": rt,
            "verified": reports.iter().all(|r| r.receiver.is_none_or(|v| v.ok())),
        }));
    }
    if args.json {
        println!(
            "{}",
            json!({
                "ok": verified,
                "peer": route.peer.to_string(),
                "transport": route.chosen.kind,
                "op": args.op.name(),
                "warmup": args.warmup,
                "reuse_connection": args.reuse_connection,
                "sweep": rows,
            })
        );
    }
    if !verified {
        eprintln!("error: the receiver's verification failed");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// MIN, 2*MIN, 4*MIN, ... up to MAX.
fn sweep_sizes(min: u64, max: u64) -> Vec<u64> {
    std::iter::successors(Some(min), |s| s.checked_mul(2))
        .take_while(|s| *s <= max)
        .collect()
}

/// The median (the lower middle for an even count); sorts `values`.
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

fn verdict_words(v: &transfer::ReceiverVerdict, user_data: bool) -> String {
    let bytes = if user_data {
        format!("{} bytes", v.received_bytes)
    } else {
        format_bytes(v.received_bytes)
    };
    match (v.status, &v.verification) {
        (AckStatus::ChecksumFailed, _) => {
            format!("received {bytes}, but chunks failed their checksums after every resend")
        }
        (AckStatus::NotStored, _) => {
            format!("verified {bytes} but could not store it (see the receiver's log)")
        }
        (AckStatus::Verified, None) => format!("verified {bytes}"),
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

/// `args` with `--streams` decided: as given, or from the machine for `auto`. Where
/// `auto` gives more than the one stream a transfer had before it was the default, a
/// note says why, once, when the first TCP transfer starts (after every option check,
/// so an error is still the first thing printed). RDMA has no streams.
fn with_streams(args: &SendArgs, peer: SocketAddr, tcp: bool) -> SendArgs {
    let (streams, streams_note) = match args.streams_asked {
        Streams::Count(n) => (n, None),
        Streams::Auto => {
            let choice = choose_streams(&StreamFacts::here(peer));
            let note = (tcp && choice.streams > 1).then_some(choice.why);
            (choice.streams, note)
        }
    };
    SendArgs {
        streams,
        streams_note,
        ..args.clone()
    }
}

/// The `--streams auto` note, once per run (a sweep measures many sizes).
fn note_streams_once(args: &SendArgs) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Some(note) = &args.streams_note {
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("note: {note}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 500.0);
        assert_eq!(percentile(&v, 90.0), 900.0);
        assert_eq!(percentile(&v, 99.0), 990.0);
        assert_eq!(percentile(&v, 99.9), 999.0);
        assert_eq!(percentile(&v, 100.0), 1000.0);
        assert_eq!(percentile(&[7.0], 99.9), 7.0);
        assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.0);
        assert_eq!(percentile(&[1.0, 2.0], 50.1), 2.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn a_sweep_doubles_from_min_to_max() {
        assert_eq!(sweep_sizes(4096, 65536), [4096, 8192, 16384, 32768, 65536]);
        assert_eq!(sweep_sizes(4, 4), [4]);
        assert_eq!(sweep_sizes(8, 20), [8, 16]);
        assert_eq!(sweep_sizes(1 << 62, u64::MAX).len(), 2);
    }

    #[test]
    fn rates_in_bytes_or_bits() {
        assert_eq!(rate_words(1.5, false), "1.500 GB/s");
        assert_eq!(rate_words(1.5, true), "12.000 Gb/s");
    }
}
