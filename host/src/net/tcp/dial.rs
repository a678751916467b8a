//! Opening a sender's TCP connection: the rails' sockets (each from its local address,
//! if one was given), the offer on the first socket (and, with a key, the proof), the
//! receiver's answer, then every other stream's hello (and, with a key, its own proof
//! over a nonce of its own). One rail opens its other sockets only once the offer is
//! accepted; several rails connect all their sockets first, so that the offer counts
//! only the rails that connected.

use super::frames::{Hello, HELLO_LEN, MAX_STREAMS};
use super::send::{TcpSender, WriteChecks};
use super::socket::{self, read_array};
use crate::server::Key;
use crate::transfer::cancel::{cancelled, Cancel, CANCELLED, CANCEL_POLL};
use crate::transfer::TransferError;
use crate::wire::{
    AcceptInfo, Challenge, Proof, RejectReason, ACCEPT_LEN, ACCEPT_MAGIC, CHALLENGE_MAGIC,
    REJECT_MAGIC,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Most rails one striped transfer uses (bits of an end marker's failed-rail mask).
pub const MAX_RAILS: usize = 32;

/// One rail: where its sockets start and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rail {
    /// The local source address (`None`: the route's).
    pub local: Option<IpAddr>,
    pub remote: SocketAddr,
}

impl Rail {
    /// The name it rests under and reports give it: its local address, else the
    /// receiver's.
    pub fn label(&self) -> String {
        match self.local {
            Some(ip) => ip.to_string(),
            None => self.remote.ip().to_string(),
        }
    }
}

/// The rails of a sender: rail k is local address k with receiver address k (or the only
/// one). No local addresses: one rail per receiver address, from the route's source.
pub fn rails_of(remotes: &[SocketAddr], locals: &[IpAddr]) -> Result<Vec<Rail>, String> {
    if remotes.is_empty() {
        return Err("no receiver address".into());
    }
    let n = locals.len().max(remotes.len());
    if remotes.len() > 1 && !locals.is_empty() && locals.len() != remotes.len() {
        return Err(format!(
            "{} receiver addresses and {} --bind-interfaces: give one receiver address, or one per interface",
            remotes.len(),
            locals.len()
        ));
    }
    if n > MAX_RAILS {
        return Err(format!("{n} rails: at most {MAX_RAILS} over TCP"));
    }
    Ok((0..n)
        .map(|k| Rail {
            local: locals.get(k).copied(),
            remote: remotes[k.min(remotes.len() - 1)],
        })
        .collect())
}

/// What a dial needs besides the offer.
#[derive(Debug, Clone)]
pub struct DialConfig {
    /// Every rail the sender has (at least one).
    pub rails: Vec<Rail>,
    /// Sockets per rail.
    pub streams: u16,
    pub timeout: Duration,
    /// How long a rail that does not answer may hold the opening up, where there are
    /// several.
    pub connect_timeout: Duration,
    pub key: Option<Key>,
    pub checks: WriteChecks,
    /// The caller's token: the wait for the receiver's answer ends when it is cancelled.
    pub cancel: Option<Cancel>,
}

/// An open connection and who it is.
pub struct Dialed {
    pub sender: TcpSender,
    /// For each rail of the connection, its place in the sender's list.
    pub connected: Vec<usize>,
    /// The rails tried and not connected, with why.
    pub failed: Vec<(usize, String)>,
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

/// Connect one socket of `rail` within `timeout`, bound to its local address first.
pub fn connect(rail: &Rail, timeout: Duration) -> io::Result<TcpStream> {
    let Some(local) = rail.local else {
        return socket::connect(rail.remote, timeout);
    };
    let socket = Socket::new(
        Domain::for_address(rail.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket
        .bind(&SockAddr::from(SocketAddr::new(local, 0)))
        .map_err(|e| io::Error::new(e.kind(), format!("binding to {local}: {e}")))?;
    socket.connect_timeout(&SockAddr::from(rail.remote), timeout)?;
    let stream: TcpStream = socket.into();
    socket::prepare(&stream, timeout)?;
    Ok(stream)
}

/// Connect `per_rail` sockets on each of `rails` at once (a rail that does not answer
/// costs its timeout once, not once per rail): each rail's sockets, or why not.
fn connect_all(
    rails: &[Rail],
    per_rail: u16,
    timeout: Duration,
) -> Vec<Result<Vec<TcpStream>, String>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = rails
            .iter()
            .map(|rail| {
                scope.spawn(move || {
                    (0..per_rail)
                        .map(|_| connect(rail, timeout))
                        .collect::<io::Result<Vec<_>>>()
                        .map_err(|e| connect_words(&e, timeout))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("its connecting thread panicked".into()))
            })
            .collect()
    })
}

/// Why a connection did not open, in words.
pub fn connect_words(e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
            "no connection within {}",
            crate::rdma::format_duration(timeout)
        ),
        _ => format!("cannot connect: {e}"),
    }
}

/// Open the rails `tried` (places in `cfg.rails`) with the offer: `header(n)` is the
/// header's bytes for a connection of `n` rails (known once the rails' sockets are
/// connected), the first stream's hello goes after it, then `name_message`; `label`
/// names the peer in errors. With one rail tried, its other streams open once the offer
/// is accepted.
pub fn dial(
    cfg: &DialConfig,
    tried: &[usize],
    header: &dyn Fn(u16) -> Vec<u8>,
    name_message: &[u8],
    label: &str,
) -> Result<Dialed, TransferError> {
    let broken = |why: String| TransferError::Broken {
        peer: label.to_string(),
        done: 0,
        total: 0,
        why,
    };
    let per_rail = cfg.streams.max(1);
    if tried.is_empty() || tried.len() * per_rail as usize > MAX_STREAMS as usize {
        return Err(TransferError::Protocol(format!(
            "{} rails of {per_rail} streams: at most {MAX_STREAMS} streams in all",
            tried.len()
        )));
    }
    let token = socket::new_token();
    let (mut first, later, connected, failed) = match tried {
        [one] => {
            let rail = &cfg.rails[*one];
            let s = connect(rail, cfg.timeout).map_err(|e| no_receiver(label, &e, cfg.timeout))?;
            (s, Vec::new(), vec![*one], Vec::new())
        }
        _ => {
            let rails: Vec<Rail> = tried.iter().map(|&k| cfg.rails[k]).collect();
            let results = connect_all(&rails, per_rail, cfg.connect_timeout);
            let mut connected = Vec::new();
            let mut sockets = Vec::new();
            let mut failed = Vec::new();
            for (&k, result) in tried.iter().zip(results) {
                match result {
                    Ok(s) => {
                        connected.push(k);
                        sockets.extend(s);
                    }
                    Err(why) => failed.push((k, why)),
                }
            }
            if connected.is_empty() {
                let why = failed
                    .iter()
                    .map(|(k, why)| format!("rail {k} ({}): {why}", cfg.rails[*k].label()))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(TransferError::NoReceiver {
                    peer: label.to_string(),
                    why: format!("no rail connected: {why}"),
                });
            }
            let mut sockets = sockets.into_iter();
            let first = sockets.next().expect("a connected rail has sockets");
            (first, sockets.collect(), connected, failed)
        }
    };
    let count = connected.len() as u16 * per_rail;
    let hello = |index: u16| {
        Hello {
            index,
            count,
            rail: index / per_rail,
            token,
        }
        .encode()
    };
    let offer = [
        &header(connected.len() as u16)[..],
        &hello(0)[..],
        name_message,
    ]
    .concat();
    first
        .write_all(&offer)
        .map_err(|e| broken(socket::why(&e, cfg.timeout, "offering the transfer")))?;
    let keyed = answer_offer(&mut first, cfg, &offer, label)?;
    let mut streams = vec![first];
    match later.is_empty() && per_rail > 1 {
        // One rail: its other streams now that the offer is accepted.
        true => {
            let rail = &cfg.rails[connected[0]];
            for index in 1..per_rail {
                let s = connect(rail, cfg.timeout)
                    .map_err(|e| broken(format!("opening stream {index}: {e}")))?;
                streams.push(s);
            }
        }
        false => streams.extend(later),
    }
    let hellos: Vec<_> = (0..streams.len() as u16).map(hello).collect();
    for (s, hello) in streams.iter_mut().zip(&hellos).skip(1) {
        s.write_all(hello)
            .map_err(|e| broken(socket::why(&e, cfg.timeout, "opening a stream")))?;
    }
    if keyed {
        prove_streams(&mut streams, &hellos, cfg, label)?;
    }
    let mut rails: Vec<Vec<TcpStream>> = Vec::new();
    let mut streams = streams.into_iter();
    for _ in 0..connected.len() {
        rails.push(streams.by_ref().take(per_rail as usize).collect());
    }
    let sender = TcpSender::start(rails, cfg.checks, cfg.timeout)
        .map_err(|e| broken(format!("cannot start the connection's threads: {e}")))?;
    Ok(Dialed {
        sender,
        connected,
        failed,
    })
}

/// The receiver's next answer (its size is an accept's, a reject's and a challenge's),
/// waiting up to `cfg.timeout` for each byte; with a cancel token, looked at every
/// [`CANCEL_POLL`] meanwhile.
fn read_answer(control: &mut TcpStream, cfg: &DialConfig) -> io::Result<[u8; ACCEPT_LEN]> {
    if cfg.cancel.is_none() {
        return read_array(control);
    }
    let mut buf = [0u8; ACCEPT_LEN];
    let mut got = 0;
    let mut quiet_since = Instant::now();
    control.set_read_timeout(Some(CANCEL_POLL))?;
    let read = loop {
        if got == buf.len() {
            break Ok(buf);
        }
        match control.read(&mut buf[got..]) {
            Ok(0) => break Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                quiet_since = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if cancelled(&cfg.cancel) {
                    break Err(io::Error::other(CANCELLED));
                }
                if quiet_since.elapsed() >= cfg.timeout {
                    break Err(e);
                }
            }
            Err(e) => break Err(e),
        }
    };
    control.set_read_timeout(Some(cfg.timeout))?;
    read
}

/// Read the receiver's answer to the offer: an accept (go on), a reject (its reason), or
/// with a receiver that has a key, a challenge: prove the key over its nonce, then read
/// the accept or reject that follows. Whether the key was asked for (then every further
/// stream proves it too: [`prove_streams`]).
fn answer_offer(
    control: &mut TcpStream,
    cfg: &DialConfig,
    offer: &[u8],
    label: &str,
) -> Result<bool, TransferError> {
    let mut challenged = false;
    loop {
        let answer = read_answer(control, cfg).map_err(|e| {
            let what = "waiting for the receiver to accept the offer";
            TransferError::Protocol(format!("{label}: {}", socket::why(&e, cfg.timeout, what)))
        })?;
        if let Some(verdict) = verdict(&answer, label) {
            return verdict.map(|()| challenged);
        }
        match [answer[0], answer[1], answer[2], answer[3]] {
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

/// An accept or a reject as the sender takes it (a new connection's offer, a kept
/// connection's next one); `None` for any other answer.
pub fn verdict(answer: &[u8], label: &str) -> Option<Result<(), TransferError>> {
    match answer.get(..4)? {
        m if m == ACCEPT_MAGIC => {
            Some(AcceptInfo::decode(answer).map(drop).map_err(|e| {
                TransferError::Protocol(format!("{label} sent an invalid accept: {e}"))
            }))
        }
        m if m == REJECT_MAGIC => Some(Err(match RejectReason::decode(answer) {
            Some(reason) => TransferError::Rejected(reason),
            None => TransferError::Protocol(format!("{label} sent an invalid reject")),
        })),
        _ => None,
    }
}

/// With a receiver that has a key: each further stream (`streams[1..]`, whose hellos are
/// `hellos[1..]`, all sent) reads its own challenge and answers with its proof over its
/// hello and that nonce. The hellos went out first, so the receiver answers them all at
/// once and this waits about one round trip, not one per stream.
fn prove_streams(
    streams: &mut [TcpStream],
    hellos: &[[u8; HELLO_LEN]],
    cfg: &DialConfig,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_pair_local_and_receiver_addresses() {
        let a: SocketAddr = "10.71.1.2:7471".parse().unwrap();
        let b: SocketAddr = "10.71.2.2:7471".parse().unwrap();
        let l1: IpAddr = "10.71.1.1".parse().unwrap();
        let l2: IpAddr = "10.71.2.1".parse().unwrap();
        let both = rails_of(&[a, b], &[l1, l2]).unwrap();
        assert_eq!(
            both[1],
            Rail {
                local: Some(l2),
                remote: b
            }
        );
        let one_remote = rails_of(&[a], &[l1, l2]).unwrap();
        assert_eq!(one_remote[1].remote, a);
        let no_locals = rails_of(&[a, b], &[]).unwrap();
        assert_eq!((no_locals.len(), no_locals[1].local), (2, None));
        assert_eq!(no_locals[1].label(), "10.71.2.2");
        assert!(rails_of(&[a, b], &[l1, l2, l1]).is_err());
        assert!(rails_of(&[], &[l1]).is_err());
    }
}
