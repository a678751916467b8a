//! A socket's first message, read within one deadline for the whole handshake
//! (`--timeout` from its accept, however the bytes trickle): a transfer offer (header and
//! stream hello, and with `--key-file` the proof of the key over a fresh nonce) goes to
//! the serving loop; a stream hello joins its transfer ([`super::routes`]), with a key
//! only once it too has proved the key over a fresh nonce of its own; anything else is
//! refused with its reason. Runs on a short-lived thread per socket, holding a
//! handshake slot of the shared admission until it returns.

use super::frames::{Hello, HELLO_LEN, HELLO_MAGIC};
use super::serving::{refuse, refuse_hello, Event, Offer, Shared};
use super::socket::{self, ReadStop};
use crate::server::admission::HandshakeSlot;
use crate::server::Key;
use crate::transfer::RecvOutcome;
use crate::wire::{
    checked_name, decode_name_prefix, Challenge, Header, Proof, RejectReason, WireError,
    HEADER_LEN, HEADER_MAGIC, NAME_PREFIX_LEN, PROOF_LEN,
};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Read `N` bytes of the handshake within its deadline.
fn read_handshake<const N: usize>(
    stream: &TcpStream,
    timeout: Duration,
    deadline: Instant,
    what: &str,
) -> Result<[u8; N], String> {
    let mut buf = [0u8; N];
    socket::read_exact_within(stream, &mut buf, timeout, Some(deadline)).map_err(
        |stop| match stop {
            ReadStop::Deadline => format!(
                "the handshake took longer than {} while {what} (--timeout)",
                crate::rdma::format_duration(timeout)
            ),
            ReadStop::Io(e) => socket::why(&e, timeout, what),
        },
    )?;
    Ok(buf)
}

/// Read the name message that follows a named offer (`--name`), within the deadline.
fn read_name(
    stream: &TcpStream,
    timeout: Duration,
    deadline: Instant,
) -> Result<(Vec<u8>, String), RejectReason> {
    let what = "reading the transfer's name";
    let bad = |e: WireError| RejectReason::BadHeader(e);
    let broken = |_: String| {
        RejectReason::BadHeader(WireError::Inconsistent {
            what: "no name message after a named offer",
        })
    };
    let prefix: [u8; NAME_PREFIX_LEN] =
        read_handshake(stream, timeout, deadline, what).map_err(broken)?;
    let len = decode_name_prefix(&prefix).map_err(bad)?;
    let mut name = vec![0u8; len];
    socket::read_exact_within(stream, &mut name, timeout, Some(deadline))
        .map_err(|_| broken(String::new()))?;
    let text = checked_name(&name).map_err(bad)?.to_string();
    Ok(([&prefix[..], &name[..]].concat(), text))
}

/// Read a socket's first message within `deadline`: a transfer offer (header + hello,
/// and with a key its proof) becomes an [`Event::Offer`]; a stream hello goes to its
/// transfer; anything else is refused. The slot is held until this returns.
pub(super) fn handshake(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    _slot: HandshakeSlot,
) -> Option<Event> {
    let cfg = &shared.cfg;
    let report = |outcome| Some(Event::Outcome(outcome));
    let failed = |why: String| RecvOutcome::Failed {
        peer: peer.to_string(),
        error: format!("{peer}: {why}"),
    };
    let magic: [u8; 4] =
        match read_handshake(&stream, cfg.timeout, deadline, "reading the transfer offer") {
            Ok(m) => m,
            Err(why) => return report(failed(why)),
        };
    match magic {
        HEADER_MAGIC => {
            let rest: [u8; HEADER_LEN + HELLO_LEN - 4] = match read_handshake(
                &stream,
                cfg.timeout,
                deadline,
                "reading the transfer offer",
            ) {
                Ok(r) => r,
                Err(why) => return report(failed(why)),
            };
            let mut offer = vec![0u8; HEADER_LEN + HELLO_LEN];
            offer[..4].copy_from_slice(&magic);
            offer[4..].copy_from_slice(&rest);
            let header = match Header::decode(&offer[..HEADER_LEN]) {
                Ok(h) => h,
                Err(e) => return report(refuse(stream, peer, RejectReason::BadHeader(e), None)),
            };
            let hello = match Hello::decode(&offer[HEADER_LEN..]) {
                Ok(h) if h.index == 0 => h,
                Ok(_) => {
                    return report(refuse_hello(
                        stream,
                        peer,
                        "the offer's stream hello is not stream 0",
                    ))
                }
                Err(e) => {
                    let reason = RejectReason::BadHeader(WireError::Inconsistent {
                        what: "bad stream hello after the header",
                    });
                    return report(refuse(stream, peer, reason, Some(e.to_string())));
                }
            };
            let mut name = None;
            if header.named {
                match read_name(&stream, cfg.timeout, deadline) {
                    Ok((bytes, text)) => {
                        offer.extend_from_slice(&bytes);
                        name = Some(text);
                    }
                    Err(reason) => return report(refuse(stream, peer, reason, None)),
                }
            }
            if let Some(key) = &cfg.key {
                if let Err(why) = prove(key, &stream, &offer, Proved::Offer, cfg.timeout, deadline)
                {
                    return report(refuse(stream, peer, RejectReason::BadProof, Some(why)));
                }
            }
            if header.total_bytes > cfg.max_bytes {
                let reason = RejectReason::TooLarge {
                    requested: header.total_bytes,
                    max: cfg.max_bytes,
                };
                return report(refuse(stream, peer, reason, None));
            }
            Some(Event::Offer(Offer {
                control: stream,
                peer,
                header,
                hello,
                name,
            }))
        }
        HELLO_MAGIC => {
            let rest: [u8; HELLO_LEN - 4] =
                match read_handshake(&stream, cfg.timeout, deadline, "reading a stream hello") {
                    Ok(r) => r,
                    Err(why) => return report(failed(why)),
                };
            let mut bytes = [0u8; HELLO_LEN];
            bytes[..4].copy_from_slice(&magic);
            bytes[4..].copy_from_slice(&rest);
            match Hello::decode(&bytes) {
                Ok(hello) => {
                    // With a key, the token is not enough (it travels in the clear, and
                    // a striped transfer's streams may come from any address): the
                    // stream proves the key before it joins anything.
                    if let Some(key) = &cfg.key {
                        let proved =
                            prove(key, &stream, &bytes, Proved::Stream, cfg.timeout, deadline);
                        if let Err(why) = proved {
                            let why = format!("stream {} of a transfer: {why}", hello.index);
                            return report(refuse(stream, peer, RejectReason::BadProof, Some(why)));
                        }
                    }
                    match shared.routes.hand_over(stream, peer, hello) {
                        Ok(()) => None,
                        Err((stream, why)) => report(refuse_hello(stream, peer, why)),
                    }
                }
                Err(e) => {
                    let reason = RejectReason::BadHeader(WireError::Inconsistent {
                        what: "bad stream hello",
                    });
                    report(refuse(stream, peer, reason, Some(e.to_string())))
                }
            }
        }
        got => report(refuse(
            stream,
            peer,
            // Neither an offer nor a stream hello: an offer is what a stranger should
            // have sent (and a `--raw` sender's is what it sends instead).
            RejectReason::BadHeader(WireError::BadMagic {
                got,
                expected: HEADER_MAGIC,
            }),
            None,
        )),
    }
}

/// What a socket proves the key for: the MACs differ ([`Key::prove_stream`]).
#[derive(Clone, Copy)]
enum Proved {
    /// A transfer offer (header, hello, name).
    Offer,
    /// A further stream's hello.
    Stream,
}

/// With `--key-file`: send a fresh nonce and check the sender's proof over `message` (the
/// offer, or a stream's hello) and it, within the handshake's deadline.
fn prove(
    key: &Key,
    stream: &TcpStream,
    message: &[u8],
    proved: Proved,
    timeout: Duration,
    deadline: Instant,
) -> Result<(), String> {
    let nonce =
        crate::server::key::fresh_nonce().map_err(|e| format!("no nonce could be drawn: {e}"))?;
    (&*stream)
        .write_all(&Challenge { nonce }.encode())
        .map_err(|e| socket::why(&e, timeout, "sending the key challenge"))?;
    let bytes: [u8; PROOF_LEN] = read_handshake(
        stream,
        timeout,
        deadline,
        "waiting for the proof of the key (has the sender the same --key-file?)",
    )?;
    let proof = Proof::decode(&bytes).map_err(|e| format!("no proof of the key: {e}"))?;
    let good = match proved {
        Proved::Offer => key.verify(message, &nonce, &proof.tag),
        Proved::Stream => key.verify_stream(message, &nonce, &proof.tag),
    };
    if good {
        Ok(())
    } else {
        Err("the proof does not match this receiver's key".into())
    }
}
