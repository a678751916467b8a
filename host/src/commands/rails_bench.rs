//! `host bench rails`: the same transfer over each rail alone and over all rails
//! striped, to a running `host recv`, rounds interleaved (each round: rail 0 alone,
//! rail 1 alone, ..., then all striped), so that a drift of the machine or the links
//! reaches every variant alike. The reference is the sum of the single-rail medians:
//! what perfect striping would reach. Every transfer must be verified by the receiver,
//! and a striped round in which a rail failed or was left out is an error, since its
//! rate would not be a striped rate.
//!
//! The rails are TCP's (`--bind-interfaces` or several receiver addresses) or, with
//! `--nic`, RDMA's (rail k from the k-th device to the k-th address, `--op write`).
//! The source is the pattern written by the CPU into host memory, so that the GPU (or
//! its absence) plays no part: this measures the rails.

use super::tcp_bench::{median, stats};
use anyhow::{bail, Context, Result};
use host::cli::RailsBenchArgs;
use host::engine::{Cooldowns, SendOptions, TcpSendOptions, VerbsSendOptions};
use host::memory::HostBuffer;
use host::memory_factory::{GpuChoice, GpuSelection, SendMemory};
use host::memory_path::{AttemptLog, Method, Plan};
use host::net::tcp::dial::{rails_of, Rail};
use host::net::verbs::dial::RailTarget;
use host::rails::NicList;
use host::transfer::SendReport;
use host::wire::Op;
use serde_json::json;
use std::net::SocketAddr;
use std::process::ExitCode;

pub fn run(args: &RailsBenchArgs) -> Result<ExitCode> {
    let remotes = super::peer::resolve_all(&args.ip, args.port)?;
    let mut transport: Box<dyn RailsTransport> = match &args.nic {
        Some(list) => Box::new(Verbs::new(args, list, &remotes)?),
        None => Box::new(Tcp::new(args, &remotes)?),
    };
    let names = transport.rails();
    let mut alone: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut striped = Vec::new();
    let mut striped_chunks = Vec::new();
    for round in 1..=args.rounds {
        for (k, name) in names.iter().enumerate() {
            let r = transport
                .transfer(&[k])
                .and_then(verified)
                .with_context(|| format!("round {round}: rail {k} ({}) alone", name.local))?;
            alone[k].push(r.gbps);
        }
        let all: Vec<usize> = (0..names.len()).collect();
        let r = transport
            .transfer(&all)
            .and_then(verified)
            .and_then(every_rail_carried)
            .with_context(|| format!("round {round}: all rails striped"))?;
        striped_chunks.push(r.rails.iter().map(|x| x.chunks).collect::<Vec<_>>());
        striped.push(r.gbps);
    }
    let sum: f64 = alone.iter().map(|v| median(v)).sum();
    let ratio = median(&striped) / sum;
    if !ratio.is_finite() || ratio <= 0.0 {
        bail!("the ratio of the striped rate to the sum of the single-rail rates is {ratio}: no rate was measured");
    }
    let per_rail: Vec<_> = names
        .iter()
        .zip(&alone)
        .enumerate()
        .map(|(k, (name, rates))| {
            let mut s = stats(rates);
            s["rail"] = json!(k);
            s["local"] = json!(name.local);
            s["remote"] = json!(name.remote);
            s
        })
        .collect();
    let mut striped_stats = stats(&striped);
    striped_stats["chunks_per_rail_rounds"] = json!(striped_chunks);
    let mut out = json!({
        "benchmark": transport.describe(),
        "receiver": args.ip,
        "port": args.port,
        "bytes": args.size,
        "chunk_bytes": args.chunk.min(args.size),
        "rounds": args.rounds,
        "timeout_seconds": args.timeout.as_secs_f64(),
        "rail_timeout_seconds": args.rail_timeout.as_secs_f64(),
        "unit": "GB/s (10^9 bytes/s), as the sender reports it: first chunk out to last chunk written (TCP) or completed (RDMA); every transfer verified by the receiver",
        "single_rail": per_rail,
        "sum_of_single_rail_medians_gb_per_s": sum,
        "striped": striped_stats,
        "ratio_striped_to_sum": ratio,
    });
    for (key, value) in transport.settings() {
        out[key] = value;
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// One rail's two ends, for the JSON and the errors.
struct RailName {
    /// TCP: the local address (or "route" when the route picks it); RDMA: the device.
    local: String,
    remote: String,
}

/// How the rails are driven: TCP sockets or RDMA queue pairs.
trait RailsTransport {
    fn rails(&self) -> Vec<RailName>;
    /// One transfer over the rails `which` (one: that rail alone; several: striped).
    fn transfer(&mut self, which: &[usize]) -> Result<SendReport>;
    fn describe(&self) -> &'static str;
    /// The transport's own settings for the JSON.
    fn settings(&self) -> Vec<(&'static str, serde_json::Value)>;
}

/// The receiver verified the transfer, or why not.
fn verified(report: SendReport) -> Result<SendReport> {
    match &report.receiver {
        Some(v) if v.ok() => Ok(report),
        Some(v) => bail!("the receiver did not verify the transfer: {:?}", v.status),
        None => bail!("the receiver gave no verdict"),
    }
}

/// A striped transfer counts only if every rail took part to the end.
fn every_rail_carried(report: SendReport) -> Result<SendReport> {
    for r in &report.rails {
        if let Some(why) = &r.left_out {
            bail!("rail {} ({}) was left out: {why}", r.rail, r.remote);
        }
        if let Some(why) = &r.failed {
            bail!("rail {} ({}) failed: {why}", r.rail, r.remote);
        }
        if r.chunks == 0 {
            bail!("rail {} ({}) carried no chunk", r.rail, r.remote);
        }
    }
    Ok(report)
}

/// TCP rails: one socket set per local interface.
struct Tcp<'a> {
    args: &'a RailsBenchArgs,
    rails: Vec<Rail>,
    source: HostBuffer,
}

impl<'a> Tcp<'a> {
    fn new(args: &'a RailsBenchArgs, remotes: &[SocketAddr]) -> Result<Self> {
        let rails = rails_of(remotes, &args.bind_interfaces).map_err(anyhow::Error::msg)?;
        if rails.len() < 2 {
            bail!("one rail: give several receiver addresses (a comma list) or several --bind-interfaces (TCP), or --nic a,b with two addresses (RDMA)");
        }
        let source = HostBuffer::with_pattern(usize::try_from(args.size)?)?;
        Ok(Tcp {
            args,
            rails,
            source,
        })
    }
}

impl RailsTransport for Tcp<'_> {
    fn rails(&self) -> Vec<RailName> {
        self.rails
            .iter()
            .map(|r| RailName {
                local: r.label(),
                remote: r.remote.to_string(),
            })
            .collect()
    }

    fn transfer(&mut self, which: &[usize]) -> Result<SendReport> {
        let args = self.args;
        let rails: Vec<Rail> = which.iter().map(|&k| self.rails[k]).collect();
        let opts = SendOptions {
            peer: rails[0].remote,
            chunk: args.chunk.min(args.size),
            depth: 16,
            timeout: args.timeout,
            progress: false,
            protocol_version: host::wire::VERSION,
            key: None,
            payload: host::transfer::PayloadOptions::default(),
            rail_timeout: args.rail_timeout,
            // A round's failure is an error of the bench: nothing rests across rounds.
            cooldowns: Cooldowns::new(),
            tcp: TcpSendOptions {
                streams: args.streams,
                rails,
                test_silent_rail: None,
            },
            verbs: Default::default(),
            cancel: None,
        };
        let mut reports =
            host::engine::connect::send_tcp(&opts, &self.source, &AttemptLog::default(), 1)?;
        reports.pop().context("the sender reported no transfer")
    }

    fn describe(&self) -> &'static str {
        "tcp rails: each rail alone and all rails striped, to a running receiver, rounds interleaved"
    }

    fn settings(&self) -> Vec<(&'static str, serde_json::Value)> {
        let bind: Vec<String> = self
            .args
            .bind_interfaces
            .iter()
            .map(ToString::to_string)
            .collect();
        vec![
            ("bind_interfaces", json!(bind)),
            ("streams_per_rail", json!(self.args.streams)),
        ]
    }
}

/// RDMA rails: one queue pair per device, the same host memory registered on each.
struct Verbs<'a> {
    args: &'a RailsBenchArgs,
    targets: Vec<RailTarget>,
    memory: SendMemory,
}

impl<'a> Verbs<'a> {
    fn new(args: &'a RailsBenchArgs, nics: &NicList, remotes: &[SocketAddr]) -> Result<Self> {
        if nics.0.len() < 2 || nics.0.len() != remotes.len() {
            bail!(
                "--nic names {} device(s) and <IP> {} address(es): RDMA rails need two or more of each, as many of one as of the other (rail k goes from the k-th device to the k-th address)",
                nics.0.len(),
                remotes.len()
            );
        }
        // The same check a striped send makes: each device is there, with its port.
        let here = host::rails::sysfs::here().map_err(anyhow::Error::msg)?;
        let ids = host::rails::resolve_nic_list(nics, &here).map_err(anyhow::Error::msg)?;
        let targets = ids
            .iter()
            .zip(remotes)
            .map(|(id, &peer)| RailTarget {
                peer,
                nic: Some(id.device.clone()),
            })
            .collect();
        let size = usize::try_from(args.size)?;
        let chunk = usize::try_from(args.chunk.min(args.size))?;
        // Host memory read in place: striping takes it, and no GPU plays a part.
        let plan = Plan {
            attempts: vec![Method::Host],
            left_out: Vec::new(),
        };
        let gpu = GpuChoice::open(GpuSelection::None, host::memory_path::MemKind::Host)?;
        Ok(Verbs {
            args,
            targets,
            memory: SendMemory::new(plan, gpu, size, chunk),
        })
    }
}

impl RailsTransport for Verbs<'_> {
    fn rails(&self) -> Vec<RailName> {
        self.targets
            .iter()
            .map(|t| RailName {
                local: t.nic.clone().unwrap_or_default(),
                remote: t.peer.to_string(),
            })
            .collect()
    }

    fn transfer(&mut self, which: &[usize]) -> Result<SendReport> {
        let args = self.args;
        let rails: Vec<RailTarget> = which.iter().map(|&k| self.targets[k].clone()).collect();
        let opts = SendOptions {
            peer: rails[0].peer,
            chunk: args.chunk.min(args.size),
            depth: args.depth,
            timeout: args.timeout,
            progress: false,
            protocol_version: host::wire::VERSION,
            key: None,
            payload: host::transfer::PayloadOptions::default(),
            rail_timeout: args.rail_timeout,
            // A round's failure is an error of the bench: nothing rests across rounds.
            cooldowns: Cooldowns::new(),
            tcp: Default::default(),
            verbs: VerbsSendOptions {
                op: Op::Write,
                nic: rails[0].nic.clone(),
                // One rail: an unstriped transfer, as `host <ip> <port> --nic <dev>` makes.
                rails: if rails.len() > 1 { rails } else { Vec::new() },
                busy_poll: false,
                test_peer_lies: None,
            },
            cancel: None,
        };
        let mut reports = host::engine::connect::send_verbs(&opts, &mut self.memory, 1)?;
        reports.pop().context("the sender reported no transfer")
    }

    fn describe(&self) -> &'static str {
        "rdma rails: each rail alone and all rails striped (RDMA WRITE_WITH_IMM from host memory), to a running receiver, rounds interleaved"
    }

    fn settings(&self) -> Vec<(&'static str, serde_json::Value)> {
        let nics: Vec<String> = self.targets.iter().filter_map(|t| t.nic.clone()).collect();
        vec![("nic", json!(nics)), ("depth", json!(self.args.depth))]
    }
}
