//! The receiver's control frames on the send side: clear-to-send frames matched to
//! sends (direct, or an eager message already sent, then a match frame), acks, and
//! requests to send pieces again.

use super::{Cts, SendReq, State, Work};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::comm::MAX_RESENDS;
use crate::error::{NetError, Result};
use crate::trace::Trace;
use crate::wire::{Ctrl, EAGER_SLOT, MAX_RECVS};
use std::net::SocketAddr;

/// One frame from the receiver; the number of pieces queued again.
pub(super) fn on_ctrl(
    st: &mut State,
    peer: SocketAddr,
    trace: &Trace,
    frame: Ctrl,
) -> Result<usize> {
    let find = |reqs: &[Option<SendReq>], id: u64, slot: u8| {
        reqs.iter().position(|r| {
            r.as_ref()
                .is_some_and(|r| r.cts_id == id && r.slot == slot && !r.acked)
        })
    };
    match frame {
        Ctrl::Cts { id, slots } => {
            if st.cts.len() >= NCCL_NET_MAX_REQUESTS || slots.len() > MAX_RECVS {
                return Err(NetError::remote(format!(
                    "{peer} posted more receives than NCCL allows in flight"
                )));
            }
            let matched = vec![false; slots.len()];
            trace.note(
                "send",
                id,
                format_args!("clear-to-send {id} received ({} buffers)", slots.len()),
            );
            st.cts.push_back(Cts { id, slots, matched });
            return resolve(st, peer, trace);
        }
        Ctrl::Ack { id, slot } => {
            let ri = find(&st.reqs, id, slot).ok_or_else(|| {
                NetError::remote(format!(
                    "{peer} acked message {id}/{slot}, which is not in flight"
                ))
            })?;
            if let Some(r) = st.reqs[ri].as_mut() {
                r.acked = true;
                trace.event("send", r.tn, format_args!("ack received"));
            }
            st.retire_if_finished(ri);
        }
        Ctrl::Nack { id, slot, pieces } => {
            let ri = find(&st.reqs, id, slot).ok_or_else(|| {
                NetError::remote(format!(
                    "{peer} asked again for message {id}/{slot}, which is not in flight"
                ))
            })?;
            let Some(r) = st.reqs[ri].as_mut() else {
                return Ok(0);
            };
            for &p in pieces.iter().rev() {
                if p >= r.layout.count {
                    return Err(NetError::remote(format!(
                        "{peer} asked again for piece {p} of a message of {} pieces",
                        r.layout.count
                    )));
                }
                r.attempts[p as usize] += 1;
                if r.attempts[p as usize] > MAX_RESENDS {
                    return Err(NetError::remote(format!(
                        "piece {p} of a {}-byte message to {peer} failed its CRC32C at the receiver {} times; \
                         giving up (a link or host that corrupts data; NCCL_GRDMA_TEST_INJECT_FAULTS set?)",
                        r.size,
                        MAX_RESENDS + 1
                    )));
                }
                r.unsent += 1;
                st.queue.push_front(Work::Piece(ri, p));
            }
            st.counters.repaired += pieces.len() as u64;
            return Ok(pieces.len());
        }
        Ctrl::Reject { reason } => {
            return Err(NetError::remote(format!(
                "the listener at {peer} refused this connection ({}): the handle is not the one that listener made",
                match reason {
                    crate::wire::REJECT_BAD_TOKEN => "wrong token",
                    _ => "bad hello",
                }
            )))
        }
    }
    Ok(0)
}

/// Matches a message of `size` bytes with `tag` to the oldest clear-to-send, unless an
/// eager message is still unmatched (then this one must go after it): the receive and
/// buffer, or `None` when none is known.
pub(super) fn direct_match(
    st: &mut State,
    peer: SocketAddr,
    size: u64,
    tag: i32,
) -> Result<Option<(u64, u8)>> {
    if !st.unresolved.is_empty() {
        return Ok(None);
    }
    let Some(head) = st.cts.front_mut() else {
        return Ok(None);
    };
    let Some(si) = (0..head.slots.len()).find(|&s| !head.matched[s] && head.slots[s].tag == tag)
    else {
        return Err(NetError::usage(format!(
            "isend to {peer}: tag {tag}, but the oldest receive posted has no free buffer with that tag \
             (tags {:?}): the ranks disagree on the order of messages",
            head.slots.iter().map(|s| s.tag).collect::<Vec<_>>()
        )));
    };
    let posted = head.slots[si].size;
    if size > posted {
        return Err(size_error(peer, size, posted, tag));
    }
    head.matched[si] = true;
    let id = head.id;
    if head.matched.iter().all(|&m| m) {
        st.cts.pop_front();
    }
    Ok(Some((id, si as u8)))
}

fn size_error(peer: SocketAddr, size: u64, posted: u64, tag: i32) -> NetError {
    NetError::usage(format!(
        "isend to {peer}: message of {size} bytes for a receive of {posted} bytes (tag {tag}): \
         the ranks disagree on sizes (NCCL_PROTO, NCCL_ALGO or buffer settings differ?)"
    ))
}

/// Matches the unmatched eager messages, oldest first, to the clear-to-send frames now
/// known, by the rule `isend` uses, and queues a match frame for each (but, where the
/// handle said `by_number`, for one that went to a receive of one buffer: the receiver
/// places that by its number); the number queued. An error (size or tag) fails the comm: the message went already.
fn resolve(st: &mut State, peer: SocketAddr, trace: &Trace) -> Result<usize> {
    let mut n = 0;
    while let (Some(u), Some(head)) = (st.unresolved.front(), st.cts.front_mut()) {
        let Some(si) =
            (0..head.slots.len()).find(|&s| !head.matched[s] && head.slots[s].tag == u.tag)
        else {
            return Err(NetError::usage(format!(
                "eager message {} to {peer} (tag {}): the receive posted for it has no free buffer \
                 with that tag (tags {:?}): the ranks disagree on the order of messages",
                u.seq,
                u.tag,
                head.slots.iter().map(|s| s.tag).collect::<Vec<_>>()
            )));
        };
        if u.size > head.slots[si].size {
            return Err(size_error(peer, u.size, head.slots[si].size, u.tag));
        }
        head.matched[si] = true;
        let (seq, cts_id) = (u.seq, head.id);
        // A receive of one buffer: the receiver places the message by its number itself.
        let single = st.by_number && head.slots.len() == 1;
        if head.matched.iter().all(|&m| m) {
            st.cts.pop_front();
        }
        st.eager_bytes -= u.size;
        st.unresolved.pop_front();
        // Not a byte of it went yet: it goes straight to its buffer instead.
        if let Some(r) = st
            .reqs
            .iter_mut()
            .flatten()
            .find(|r| r.slot == EAGER_SLOT && r.cts_id == seq && r.taken == 0)
        {
            r.cts_id = cts_id;
            r.slot = si as u8;
            trace.note(
                "send",
                seq,
                format_args!("eager {seq} not yet written: sent to {cts_id}/{si} instead"),
            );
            continue;
        }
        trace.note(
            "send",
            seq,
            format_args!(
                "eager {seq} matched to {cts_id}/{si}{}",
                if single {
                    " (placed by the receiver)"
                } else {
                    ""
                }
            ),
        );
        if single {
            continue;
        }
        st.queue.push_back(Work::Match {
            seq,
            cts_id,
            slot: si as u8,
        });
        st.matches_unwritten += 1;
        n += 1;
    }
    Ok(n)
}
