//! Opening a sender's connection and running its transfers: the offer is the engine's
//! (the header, the name), which rails are tried is the engine's (rails resting after a
//! failure are left out while another can go; a rail that does not connect rests), the
//! opening itself is the transport's (its `dial`), and what runs on the link once open is
//! [`super::send`]'s.

use super::kept::KeptSender;
use super::offer::offer;
use super::options::SendOptions;
use super::send::{self, Facts, RailName, Shape};
use super::sending::Sending;
use crate::memory::SendSource;
use crate::memory_factory::SendMemory;
use crate::memory_path::{walk, AttemptLog, LeftOut, Method, Plan};
use crate::net::tcp::dial::{self, DialConfig, Rail};
use crate::net::tcp::frames::MAX_STREAMS;
use crate::net::tcp::send::WriteChecks;
use crate::net::verbs::{
    self,
    dial::{RailTarget, Source},
};
use crate::net::SendLink;
use crate::transfer::{SendReport, TransferError};
use crate::wire::{Op, MAX_VERBS_RAILS};
use std::time::{Duration, Instant};

/// A send whose caller cancelled it already opens nothing (a retry after a kept
/// connection closed, a pending send cancelled before its thread began).
fn not_cancelled(opts: &SendOptions) -> Result<(), TransferError> {
    match crate::transfer::cancel::cancelled(&opts.cancel) {
        true => Err(TransferError::Protocol(
            crate::transfer::cancel::CANCELLED.into(),
        )),
        false => Ok(()),
    }
}

/// Which of `labels` to try, and why the others are left out: those resting after a
/// failure, unless all are (then all are tried rather than none).
fn rails_to_try(
    labels: &[String],
    cooldowns: &super::cooldown::Cooldowns,
) -> (Vec<usize>, Vec<(usize, String)>) {
    if labels.len() < 2 {
        return ((0..labels.len()).collect(), Vec::new());
    }
    let now = Instant::now();
    let mut left_out = Vec::new();
    let tried: Vec<usize> = (0..labels.len())
        .filter(|&k| match cooldowns.resting(&labels[k], now) {
            Some(left) => {
                let left = crate::rdma::format_duration(left);
                left_out.push((k, format!("resting after a failure ({left} more)")));
                false
            }
            None => true,
        })
        .collect();
    match tried.is_empty() {
        true => ((0..labels.len()).collect(), Vec::new()),
        false => (tried, left_out),
    }
}

/// `transfers` transfers of `source` to `opts.peer` over TCP on one connection (1: a
/// plain transfer; more: `--reuse-connection`), each verified and acked before the next.
pub fn send_tcp(
    opts: &SendOptions,
    source: &dyn SendSource,
    memory_log: &AttemptLog,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    send_tcp_keeping(opts, source, memory_log, transfers, None)
}

/// [`send_tcp`]; with `keep`, the offer asks the receiver to keep the connection
/// ([`HINT_SESSION`](crate::wire::HINT_SESSION)), and a connection whose transfers all
/// verified is left in `keep` for the next offer ([`super::kept`]).
pub fn send_tcp_keeping(
    opts: &SendOptions,
    source: &dyn SendSource,
    memory_log: &AttemptLog,
    transfers: u32,
    keep: Option<&mut Option<KeptSender>>,
) -> Result<Vec<SendReport>, TransferError> {
    not_cancelled(opts)?;
    let t0 = Instant::now();
    let label = opts.peer.to_string();
    let streams = opts.tcp.streams;
    if !(1..=MAX_STREAMS).contains(&streams) {
        return Err(TransferError::Protocol(format!(
            "--streams {streams} is outside 1..={MAX_STREAMS}"
        )));
    }
    let (mut header, plan, name_message) = offer(opts, source.len() as u64, transfers, Op::Send)?;
    if keep.is_some() {
        header = header.with_session();
    }
    let rails: Vec<Rail> = match opts.tcp.rails.is_empty() {
        true => vec![Rail {
            local: None,
            remote: opts.peer,
        }],
        false => opts.tcp.rails.clone(),
    };
    if rails.len() * streams as usize > MAX_STREAMS as usize {
        return Err(TransferError::Protocol(format!(
            "{} rails of {streams} streams: at most {MAX_STREAMS} streams in all",
            rails.len()
        )));
    }
    let names: Vec<RailName> = rails
        .iter()
        .map(|r| RailName {
            local: r.local.map(|ip| ip.to_string()),
            remote: r.remote.to_string(),
            label: r.label(),
        })
        .collect();
    let labels: Vec<String> = names.iter().map(|n| n.label.clone()).collect();
    let (tried, mut left_out) = rails_to_try(&labels, &opts.cooldowns);
    let cfg = DialConfig {
        rails: rails.clone(),
        streams,
        timeout: opts.timeout,
        // A rail that does not answer should not hold the transfer up for all of
        // --timeout.
        connect_timeout: opts
            .timeout
            .min((opts.rail_timeout * 4).max(Duration::from_secs(1))),
        key: opts.key.clone(),
        checks: WriteChecks {
            checksum: opts.payload.verify.checksum(),
            faults: opts.payload.faults,
            silent_rail: opts.tcp.test_silent_rail,
        },
        cancel: opts.cancel.clone(),
    };
    let version = opts.protocol_version;
    // The header as it went (a kept connection's next offers must say the same rails).
    let header_sent = std::cell::Cell::new(header);
    let header_for = |rails: u16| -> Vec<u8> {
        let h = match rails > 1 {
            true => header.with_rails(rails as u8).unwrap_or(header),
            false => header,
        };
        header_sent.set(h);
        h.encode_with_version(version).to_vec()
    };
    let dialed = dial::dial(&cfg, &tried, &header_for, &name_message, &label);
    let mut dialed = match dialed {
        Ok(d) => d,
        Err(e) => {
            // Rails that did not connect rest, when there were several to choose from.
            if tried.len() > 1 {
                for &k in &tried {
                    opts.cooldowns.failed(&labels[k], Instant::now());
                }
            }
            return Err(e);
        }
    };
    for (k, why) in dialed.failed.drain(..) {
        let rest = opts.cooldowns.failed(&labels[k], Instant::now());
        left_out.push((
            k,
            format!("{why}; resting {}", crate::rdma::format_duration(rest)),
        ));
    }
    let connect_seconds = t0.elapsed().as_secs_f64();
    let facts = Facts {
        peer: &label,
        device: None,
        op: "tcp",
        connect_seconds,
        memory: memory_log,
        rails: &names,
        connected: &dialed.connected,
        left_out: &left_out,
        cooldowns: &opts.cooldowns,
    };
    let shape = Shape::of(opts, &header, plan, transfers);
    let rail_timeout = opts.rail_timeout;
    let sent = dialed
        .sender
        .with_source(source.memory(), |link| {
            let mut sending = Sending::new(link, rail_timeout);
            sending.cancel_on(opts.cancel.clone());
            send::transfers(&mut sending, source, &shape, &facts)
        })
        .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
    if let (Some(keep), Ok(reports)) = (keep, &sent) {
        if reports.iter().all(SendReport::verified) && dialed.sender.usable() {
            *keep = Some(KeptSender::new(
                dialed.sender,
                opts,
                header_sent.get(),
                names,
                dialed.connected,
            ));
        }
    }
    sent
}

/// `transfers` transfers of `memory`'s data to `opts.peer` over verbs on one connection
/// (striped over `opts.verbs.rails` where two or more are given), each verified and
/// acked before the next. The source is chosen as the connection opens: the first
/// method of the plan whose memory the NIC registers.
pub fn send_verbs(
    opts: &SendOptions,
    memory: &mut SendMemory,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    let bytes = memory.len() as u64;
    send_verbs_from(opts, &mut Source::Plan(memory), bytes, transfers)
}

/// [`send_verbs`] of memory the caller gives (the library's), registered as it is.
pub fn send_verbs_source(
    opts: &SendOptions,
    source: &dyn SendSource,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    send_verbs_from(
        opts,
        &mut Source::Given(source),
        source.len() as u64,
        transfers,
    )
}

fn send_verbs_from(
    opts: &SendOptions,
    memory: &mut Source<'_>,
    bytes: u64,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    not_cancelled(opts)?;
    let label = opts.peer.to_string();
    let v = &opts.verbs;
    let (header, plan, name_message) = offer(opts, bytes, transfers, v.op)?;
    let rails: Vec<RailTarget> = match v.rails.len() {
        0 | 1 => vec![RailTarget {
            peer: opts.peer,
            nic: v.nic.clone(),
        }],
        _ => v.rails.clone(),
    };
    if rails.len() > MAX_VERBS_RAILS as usize {
        return Err(TransferError::Protocol(format!(
            "{} rails: a verbs transfer is striped over at most {MAX_VERBS_RAILS}",
            rails.len()
        )));
    }
    if rails.len() > 1 && opts.key.is_some() {
        return Err(TransferError::Protocol(
            "--key-file is not striped over verbs (a further rail's join cannot prove the key; TCP's streams can): give one receiver address".into(),
        ));
    }
    let labels: Vec<String> = rails.iter().map(RailTarget::label).collect();
    let (tried, left_out) = rails_to_try(&labels, &opts.cooldowns);
    let cfg = verbs::dial::DialConfig {
        rails: &rails,
        tried: &tried,
        op: v.op,
        chunk: plan.chunk_bytes(),
        depth: opts.depth,
        timeout: opts.timeout,
        busy_poll: v.busy_poll,
        key: opts.key.as_ref(),
        faults: opts.payload.faults,
        lies: v.test_peer_lies,
        protocol_version: opts.protocol_version,
    };
    let version = opts.protocol_version;
    let offer_for = |count: u8| -> Result<Vec<u8>, TransferError> {
        let h = match count > 1 {
            true => header
                .with_rails(count)
                .map_err(|e| TransferError::Protocol(format!("cannot offer this transfer: {e}")))?,
            false => header,
        };
        Ok(h.encode_with_version(version).to_vec())
    };
    let shape = Shape::of(opts, &header, plan, transfers);
    verbs::dial::dial(&cfg, memory, &offer_for, &mut |link, dialed| {
        let now = Instant::now();
        let mut left_out = left_out.clone();
        for (k, why) in &dialed.left_out {
            let rest = opts.cooldowns.failed(&labels[*k], now);
            let rest = crate::rdma::format_duration(rest);
            left_out.push((*k, format!("{why}; resting {rest}")));
        }
        let names: Vec<RailName> = rails
            .iter()
            .enumerate()
            .map(|(k, r)| RailName {
                local: match dialed.connected.iter().position(|&c| c == k) {
                    Some(j) => Some(dialed.locals[j].clone()),
                    None => r.nic.clone(),
                },
                remote: r.peer.to_string(),
                label: labels[k].clone(),
            })
            .collect();
        if !name_message.is_empty() {
            // The name is the first message, ahead of the data.
            link.send_message(0, &name_message)
                .map_err(|e| TransferError::Protocol(format!("{label}: sending the name: {e}")))?;
        }
        let facts = Facts {
            peer: &label,
            device: dialed.device.clone(),
            op: v.op.name(),
            connect_seconds: dialed.connect_seconds,
            memory: &dialed.memory,
            rails: &names,
            connected: &dialed.connected,
            left_out: &left_out,
            cooldowns: &opts.cooldowns,
        };
        let mut sending = Sending::new(link, opts.rail_timeout);
        sending.cancel_on(opts.cancel.clone());
        send::transfers(&mut sending, dialed.source, &shape, &facts)
    })
}

/// The sender's memory plan over TCP: no NIC reads the memory, so GPUDirect methods
/// (which exist to let a NIC read GPU memory) are left out with that reason; what stays
/// is staged, mapped or host memory, tried in the plan's order.
pub fn tcp_plan(plan: &Plan) -> Plan {
    let mut out = plan.clone();
    for method in plan.attempts.iter().filter(|m| m.is_gpudirect()) {
        out.left_out.push(LeftOut {
            method: *method,
            why: "over TCP no NIC reads the memory; GPU memory goes through the staged ring".into(),
        });
    }
    out.attempts.retain(|m| !m.is_gpudirect());
    out
}

/// Make the first source of the plan that can be made (no registration to try over
/// TCP: a method fails only if its memory cannot be allocated or generated).
pub fn choose_source(
    memory: &mut SendMemory,
) -> Result<(&dyn SendSource, AttemptLog), TransferError> {
    let plan = memory.plan().clone();
    let walked = walk(&plan, |method: Method| {
        memory
            .source(method)
            .map(drop)
            .map_err(|e| format!("{e:#}"))
    })
    .map_err(|e| TransferError::Memory(e.into()))?;
    memory.settle(walked.method);
    let source = memory
        .source(walked.method)
        .map_err(TransferError::Memory)?;
    Ok((source, walked.log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_plans_leave_gpudirect_out_with_the_reason() {
        let plan = Plan {
            attempts: vec![
                Method::DmaBuf,
                Method::PeerMem,
                Method::Staged,
                Method::Mapped,
            ],
            left_out: Vec::new(),
        };
        let tcp = tcp_plan(&plan);
        assert_eq!(tcp.attempts, [Method::Staged, Method::Mapped]);
        assert_eq!(tcp.left_out.len(), 2);
        assert!(tcp.left_out[0].why.contains("no NIC"));
    }

    #[test]
    fn resting_rails_are_left_out_unless_all_rest() {
        let c = super::super::cooldown::Cooldowns::new();
        let labels: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        assert_eq!(rails_to_try(&labels, &c).0, vec![0, 1]);
        c.failed("a", Instant::now());
        let (tried, left) = rails_to_try(&labels, &c);
        assert_eq!(tried, vec![1]);
        assert!(left[0].1.contains("resting"));
        c.failed("b", Instant::now());
        assert_eq!(
            rails_to_try(&labels, &c).0,
            vec![0, 1],
            "all rest: all tried"
        );
    }
}
