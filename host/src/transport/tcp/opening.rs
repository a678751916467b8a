//! Opening a TCP sender's connection: the offer on the first socket (and, with a key,
//! the proof), the receiver's answer, then the other streams with their hellos (and,
//! with a key, each stream's own proof over a nonce of its own); over
//! one rail as before rails, or over several (`--bind-interfaces`), every rail's sockets
//! connected first so that the offer counts only the rails that connected.

use super::config::TcpSendConfig;
use super::frames::{Hello, HELLO_LEN};
use super::rails::{Cooldowns, Rail};
use super::socket::{self, read_array};
use crate::transfer::TransferError;
use crate::wire::{
    AcceptInfo, Challenge, Header, Proof, RejectReason, ACCEPT_LEN, ACCEPT_MAGIC, CHALLENGE_MAGIC,
    REJECT_MAGIC,
};
use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The streams of one connection, and who they are.
pub(super) struct Opened {
    pub control: TcpStream,
    /// Every stream in order, the control socket's clone first: rail `r`'s streams are
    /// `r * n .. (r + 1) * n` (`r` counted among the rails that connected).
    pub streams: Vec<TcpStream>,
    /// For each connected rail, its place in the sender's list.
    pub rails: Vec<usize>,
    /// The rails left out, with why.
    pub left_out: Vec<(usize, String)>,
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

/// Read the receiver's answer to the offer: an accept (go on), a reject (its reason), or
/// with a receiver that has a key, a challenge: prove the key over its nonce, then read
/// the accept or reject that follows. Whether the key was asked for (then every further
/// stream proves it too: [`prove_streams`]).
fn answer_offer(
    control: &mut TcpStream,
    cfg: &TcpSendConfig,
    offer: &[u8],
    label: &str,
) -> Result<bool, TransferError> {
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
                return Ok(challenged);
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

/// With a receiver that has a key: each further stream (`streams[1..]`, whose hellos are
/// `hellos[1..]`, all sent) reads its own challenge and answers with its proof over its
/// hello and that nonce. The hellos went out first, so the receiver answers them all at
/// once and this waits about one round trip, not one per stream.
fn prove_streams(
    streams: &mut [TcpStream],
    hellos: &[[u8; HELLO_LEN]],
    cfg: &TcpSendConfig,
    label: &str,
) -> Result<(), TransferError> {
    let Some(key) = &cfg.key else {
        return Err(TransferError::Protocol(format!(
            "{label} serves only senders with its key: give this sender the same --key-file"
        )));
    };
    for (index, (s, hello)) in streams.iter_mut().zip(hellos).enumerate().skip(1) {
        let what = "waiting for the receiver's key challenge to a stream";
        let answer: [u8; ACCEPT_LEN] = read_array(s).map_err(|e| {
            TransferError::Protocol(format!(
                "{label}: stream {index}: {}",
                socket::why(&e, cfg.timeout, what)
            ))
        })?;
        if answer[..4] == REJECT_MAGIC {
            return Err(match RejectReason::decode(&answer) {
                Some(reason) => TransferError::Rejected(reason),
                None => TransferError::Protocol(format!("{label} sent an invalid reject")),
            });
        }
        let challenge = Challenge::decode(&answer).map_err(|e| {
            TransferError::Protocol(format!(
                "{label} sent stream {index} an invalid key challenge: {e}"
            ))
        })?;
        let proof = Proof {
            tag: key.prove_stream(hello, &challenge.nonce),
        };
        s.write_all(&proof.encode()).map_err(|e| {
            TransferError::Protocol(format!(
                "{label}: stream {index}: {}",
                socket::why(&e, cfg.timeout, "sending the proof of the key")
            ))
        })?;
    }
    Ok(())
}

/// One rail, as before rails: the offer on the first socket, the other streams opened
/// once it is accepted (from the rail's local address, if one was given).
pub(super) fn open_single(
    cfg: &TcpSendConfig,
    rail: &Rail,
    header: &Header,
    name_message: &[u8],
    label: &str,
) -> Result<Opened, TransferError> {
    let token = socket::new_token();
    let hello = |index: u16| {
        Hello {
            index,
            count: cfg.streams,
            rail: 0,
            token,
        }
        .encode()
    };
    let broken = |why: String| TransferError::Broken {
        peer: label.to_string(),
        done: 0,
        total: cfg.bytes,
        why,
    };
    let mut control = super::rails::connect(rail, cfg.timeout)
        .map_err(|e| no_receiver(label, &e, cfg.timeout))?;
    let offer = [
        &header.encode_with_version(cfg.protocol_version)[..],
        &hello(0)[..],
        name_message,
    ]
    .concat();
    control
        .write_all(&offer)
        .map_err(|e| broken(socket::why(&e, cfg.timeout, "offering the transfer")))?;
    let keyed = answer_offer(&mut control, cfg, &offer, label)?;
    let mut streams = vec![control.try_clone().map_err(|e| broken(e.to_string()))?];
    for index in 1..cfg.streams {
        let mut s = super::rails::connect(rail, cfg.timeout)
            .map_err(|e| broken(format!("opening stream {index}: {}", e)))?;
        s.write_all(&hello(index))
            .map_err(|e| broken(socket::why(&e, cfg.timeout, "opening a stream")))?;
        streams.push(s);
    }
    if keyed {
        let hellos: Vec<_> = (0..cfg.streams).map(hello).collect();
        prove_streams(&mut streams, &hellos, cfg, label)?;
    }
    Ok(Opened {
        control,
        streams,
        rails: vec![0],
        left_out: Vec::new(),
    })
}

/// Several rails: every rail's sockets are connected first (at once, each rail from its
/// local address), so that the offer counts only the rails that connected; rails resting
/// after a failure are left out unless all are. The offer goes on the first connected
/// rail's first socket; the others say their stream and rail once it is accepted.
pub(super) fn open_striped(
    cfg: &TcpSendConfig,
    all: &[Rail],
    header: &Header,
    name_message: &[u8],
    label: &str,
) -> Result<Opened, TransferError> {
    let now = Instant::now();
    let cooldowns = Cooldowns::global();
    let mut left_out = Vec::new();
    let mut tried: Vec<usize> = (0..all.len())
        .filter(|&k| match cooldowns.resting(&all[k].label(), now) {
            Some(left) => {
                let left = crate::rdma::format_duration(left);
                left_out.push((k, format!("resting after a failure ({left} more)")));
                false
            }
            None => true,
        })
        .collect();
    if tried.is_empty() {
        // All rest: try them all rather than fail without trying.
        tried = (0..all.len()).collect();
        left_out.clear();
    }
    // A rail that does not answer should not hold the transfer up for all of --timeout.
    let connect_timeout = cfg
        .timeout
        .min((cfg.rail_timeout * 4).max(Duration::from_secs(1)));
    let rails: Vec<Rail> = tried.iter().map(|&k| all[k]).collect();
    let results = super::rails::connect_all(&rails, cfg.streams, connect_timeout);
    let mut connected = Vec::new();
    let mut sockets = Vec::new();
    for (&k, result) in tried.iter().zip(results) {
        match result {
            Ok(s) => {
                connected.push(k);
                sockets.push(s);
            }
            Err(why) => {
                let rest = cooldowns.failed(&all[k].label(), Instant::now());
                let rest = crate::rdma::format_duration(rest);
                left_out.push((k, format!("{why}; resting {rest}")));
            }
        }
    }
    if connected.is_empty() {
        let why = left_out
            .iter()
            .map(|(k, why)| format!("rail {k} ({}): {why}", all[*k].label()))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(TransferError::NoReceiver {
            peer: label.to_string(),
            why: format!("no rail connected: {why}"),
        });
    }
    let broken = |why: String| TransferError::Broken {
        peer: label.to_string(),
        done: 0,
        total: cfg.bytes,
        why,
    };
    let token = socket::new_token();
    let count = connected.len() as u16 * cfg.streams;
    let hello = |index: u16, rail: u16| {
        Hello {
            index,
            count,
            rail,
            token,
        }
        .encode()
    };
    let mut streams: Vec<TcpStream> = sockets.into_iter().flatten().collect();
    let mut control = streams[0].try_clone().map_err(|e| broken(e.to_string()))?;
    let offer = [
        &header.encode_with_version(cfg.protocol_version)[..],
        &hello(0, 0)[..],
        name_message,
    ]
    .concat();
    control
        .write_all(&offer)
        .map_err(|e| broken(socket::why(&e, cfg.timeout, "offering the transfer")))?;
    let keyed = answer_offer(&mut control, cfg, &offer, label)?;
    let hellos: Vec<_> = (0..streams.len())
        .map(|index| hello(index as u16, (index / cfg.streams as usize) as u16))
        .collect();
    for (s, hello) in streams.iter_mut().zip(&hellos).skip(1) {
        s.write_all(hello)
            .map_err(|e| broken(socket::why(&e, cfg.timeout, "opening a stream")))?;
    }
    if keyed {
        prove_streams(&mut streams, &hellos, cfg, label)?;
    }
    Ok(Opened {
        control,
        streams,
        rails: connected,
        left_out,
    })
}
