//! The TCP sender: offer the transfer on stream 0, open the other streams once accepted,
//! run the shared chunk schedule over a [`TcpWire`], read the receiver's ack after each
//! transfer.

use super::frames::{Hello, MAX_STREAMS};
use super::socket::{self, read_array};
use super::wire::TcpWire;
use crate::memory::select::{walk, AttemptLog, LeftOut, Method, Plan};
use crate::memory::{SendMemory, SendSource};
use crate::transfer::header::{
    AcceptInfo, Ack, AckStatus, Challenge, Header, Op, Proof, RejectReason, ACCEPT_LEN,
    ACCEPT_MAGIC, ACK_LEN, CHALLENGE_MAGIC, REJECT_MAGIC,
};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::Framed;
use crate::transfer::schedule::Schedule;
use crate::transfer::{SendReport, TransferError};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Everything the TCP sender needs, built by the CLI.
#[derive(Debug, Clone)]
pub struct TcpSendConfig {
    pub peer: SocketAddr,
    pub bytes: u64,
    pub chunk: u64,
    /// Chunks handed to the writer threads and not yet written.
    pub depth: u32,
    /// Sockets per connection (NCCL's NCCL_NSOCKS_PERTHREAD).
    pub streams: u16,
    /// Bound of every socket operation; restarts on progress.
    pub timeout: Duration,
    pub progress: bool,
    pub protocol_version: u16,
    /// `--key-file`: proves to a receiver with the same key that this sender may send.
    pub key: Option<crate::server::Key>,
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

fn no_receiver(peer: &str, e: &io::Error, timeout: Duration) -> TransferError {
    let why = match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("no answer within {}", crate::rdma::format_duration(timeout))
        }
        _ => e.to_string(),
    };
    TransferError::NoReceiver {
        peer: peer.to_string(),
        why,
    }
}

/// `transfers` transfers of `source` on one TCP connection (`--reuse-connection`; 1 is a
/// plain transfer). As on verbs, each is verified and acked before the next starts, and
/// only the first report carries the connection setup time.
pub fn send_repeated(
    cfg: &TcpSendConfig,
    source: &dyn SendSource,
    memory_log: &AttemptLog,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    let t0 = Instant::now();
    let label = cfg.peer.to_string();
    let total = cfg.bytes;
    if !(1..=MAX_STREAMS).contains(&cfg.streams) {
        return Err(TransferError::Protocol(format!(
            "--streams {} is outside 1..={MAX_STREAMS}",
            cfg.streams
        )));
    }
    let plan = ChunkPlan::new(total, cfg.chunk).map_err(TransferError::Protocol)?;
    let header = Header::new(Op::Send, total, plan.chunk_bytes(), cfg.depth)
        .and_then(|h| h.with_transfers(transfers))
        .map_err(|e| TransferError::Protocol(format!("cannot offer this transfer: {e}")))?;
    let token = socket::new_token();
    let hello = |index: u16| {
        Hello {
            index,
            count: cfg.streams,
            token,
        }
        .encode()
    };
    let broken = |done: u64, why: String| TransferError::Broken {
        peer: label.clone(),
        done,
        total,
        why,
    };

    let mut control =
        socket::connect(cfg.peer, cfg.timeout).map_err(|e| no_receiver(&label, &e, cfg.timeout))?;
    let offer = [
        &header.encode_with_version(cfg.protocol_version)[..],
        &hello(0)[..],
    ]
    .concat();
    control
        .write_all(&offer)
        .map_err(|e| broken(0, socket::why(&e, cfg.timeout, "offering the transfer")))?;
    answer_offer(&mut control, cfg, &offer, &label)?;
    let mut streams = vec![control.try_clone().map_err(|e| broken(0, e.to_string()))?];
    for index in 1..cfg.streams {
        let mut s = socket::connect(cfg.peer, cfg.timeout)
            .map_err(|e| broken(0, format!("opening stream {index}: {}", e)))?;
        s.write_all(&hello(index))
            .map_err(|e| broken(0, socket::why(&e, cfg.timeout, "opening a stream")))?;
        streams.push(s);
    }
    let connect_seconds = t0.elapsed().as_secs_f64();

    let mut schedule = Schedule::new(plan, cfg.depth, source, cfg.timeout);
    schedule.progress = cfg.progress;
    TcpWire::scope(source.memory(), &streams, cfg.timeout, |wire| {
        let mut reports = Vec::new();
        for k in 0..transfers {
            wire.next_transfer();
            let start = Instant::now();
            let seconds = match schedule.run(source, wire, &label) {
                Ok(took) => took.as_secs_f64(),
                // The receiver may have ended it on purpose, and said why.
                Err(e) => return Err(ended_early(&mut control, &label, total).unwrap_or(e)),
            };
            let ack = read_ack(&mut control, cfg.timeout, &label)?;
            ack.check_counts(total)
                .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
            let round_trip_seconds = start.elapsed().as_secs_f64();
            let framed = Framed {
                peer: &label,
                device: None,
                op: "tcp",
                plan: &plan,
                in_flight: schedule.window as u32,
                connect_seconds,
                path: source.path(),
                memory: memory_log,
            };
            reports.push(framed.report(k, seconds, round_trip_seconds, &ack));
        }
        Ok(reports)
    })
    .map_err(TransferError::Memory)?
}

/// Read the receiver's answer to the offer: an accept (go on), a reject (its reason), or
/// with a receiver that has a key, a challenge: prove the key over its nonce, then read
/// the accept or reject that follows.
fn answer_offer(
    control: &mut TcpStream,
    cfg: &TcpSendConfig,
    offer: &[u8],
    label: &str,
) -> Result<(), TransferError> {
    let mut challenged = false;
    loop {
        let answer: [u8; ACCEPT_LEN] = read_array(control).map_err(|e| {
            let what = "waiting for the receiver to accept the offer";
            TransferError::Protocol(format!("{label}: {}", socket::why(&e, cfg.timeout, what)))
        })?;
        match [answer[0], answer[1], answer[2], answer[3]] {
            ACCEPT_MAGIC => {
                AcceptInfo::decode(&answer).map_err(|e| {
                    TransferError::Protocol(format!("{label} sent an invalid accept: {e}"))
                })?;
                return Ok(());
            }
            REJECT_MAGIC => {
                return Err(match RejectReason::decode(&answer) {
                    Some(reason) => TransferError::Rejected(reason),
                    None => TransferError::Protocol(format!("{label} sent an invalid reject")),
                })
            }
            CHALLENGE_MAGIC if !challenged => {
                challenged = true;
                let challenge = Challenge::decode(&answer).map_err(|e| {
                    TransferError::Protocol(format!("{label} sent an invalid key challenge: {e}"))
                })?;
                let Some(key) = &cfg.key else {
                    return Err(TransferError::Protocol(format!(
                        "{label} serves only senders with its key: give this sender the same --key-file"
                    )));
                };
                let proof = Proof {
                    tag: key.prove(offer, &challenge.nonce),
                };
                control.write_all(&proof.encode()).map_err(|e| {
                    TransferError::Protocol(format!(
                        "{label}: {}",
                        socket::why(&e, cfg.timeout, "sending the proof of the key")
                    ))
                })?;
            }
            _ => {
                return Err(TransferError::NotFramed {
                    peer: label.to_string(),
                    why: "its answer to the offer is neither accept nor reject".into(),
                })
            }
        }
    }
}

/// After a failed write: the receiver's reason, if it ended the transfer with a "too
/// slow" ack (`--min-rate`) that is waiting on the control socket (looked for briefly).
fn ended_early(control: &mut TcpStream, label: &str, total: u64) -> Option<TransferError> {
    control
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok()?;
    let bytes: [u8; ACK_LEN] = read_array(control).ok()?;
    let ack = Ack::decode(&bytes).ok()?;
    (ack.status == AckStatus::TooSlow).then(|| TransferError::Broken {
        peer: label.to_string(),
        done: ack.received_bytes,
        total,
        why: format!(
            "the receiver ended the transfer: sender too slow ({} had arrived by its --min-rate deadline)",
            crate::transfer::units::format_bytes(ack.received_bytes)
        ),
    })
}

fn read_ack(control: &mut TcpStream, timeout: Duration, label: &str) -> Result<Ack, TransferError> {
    let bytes: [u8; ACK_LEN] = read_array(control).map_err(|e| {
        TransferError::Protocol(format!(
            "no verification result from {label}: {}",
            socket::why(&e, timeout, "waiting for it")
        ))
    })?;
    Ack::decode(&bytes)
        .map_err(|e| TransferError::Protocol(format!("the receiver's ack is invalid: {e}")))
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
}
