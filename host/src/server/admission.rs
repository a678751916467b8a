//! One admission controller for every receiver: what a receiver holds at once for its
//! peers (transfers being served, bytes of buffers, handshakes in progress, open
//! descriptors), and each peer address's share of it.
//!
//! Every question is answered at once, from counters under one lock: nothing here waits
//! on a peer. What is granted is an RAII value ([`HandshakeSlot`], [`Lease`]) that gives
//! its share back when dropped, so a transfer that ends by an error, a panic unwinding
//! its thread or a refusal cannot leak its share.

use super::allow::peer_key;
use crate::wire::RejectReason;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a receiver may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Transfers served at once (`--max-connections`; 1 with `--once`).
    pub max_connections: usize,
    /// Bytes of buffers held at once: host buffers, page-locked rings, GPU memory
    /// (`--max-memory`).
    pub max_memory: u64,
    /// Sockets in their handshake at once, all peers together.
    pub max_handshakes: usize,
    /// Sockets in their handshake at once from one address.
    pub max_handshakes_per_peer: usize,
    /// Transfers served at once for one address (`--max-per-peer`).
    pub max_per_peer: usize,
    /// Descriptors that handshakes and transfers may hold together (`u64::MAX`: not
    /// counted, as on verbs where a connection holds no socket).
    pub max_descriptors: u64,
}

/// Sockets in their handshake at once at most, all peers together (TCP).
pub const MAX_HANDSHAKES: usize = 256;
/// Sockets in their handshake at once from one address: more than a TCP sender's largest
/// burst of stream sockets (64), well under [`MAX_HANDSHAKES`], so one address cannot
/// take every slot.
pub const MAX_HANDSHAKES_PER_PEER: usize = 80;
/// Descriptors kept free for everything else (the listener, standard streams, files).
const SPARE_DESCRIPTORS: u64 = 32;

impl Limits {
    /// A receiver's limits from its options: one connection with `--once`; handshakes
    /// as above; descriptors up to this process's open-files limit, less a spare.
    pub fn receiver(
        once: bool,
        max_connections: usize,
        max_memory: u64,
        max_per_peer: usize,
    ) -> Limits {
        Limits {
            max_connections: if once { 1 } else { max_connections.max(1) },
            max_memory,
            max_handshakes: MAX_HANDSHAKES,
            max_handshakes_per_peer: MAX_HANDSHAKES_PER_PEER,
            max_per_peer: max_per_peer.max(1),
            max_descriptors: open_files_limit()
                .map_or(u64::MAX, |n| n.saturating_sub(SPARE_DESCRIPTORS)),
        }
    }
}

/// The descriptors this process may open (the soft `RLIMIT_NOFILE`), read from
/// `/proc/self/limits`; `None` where it cannot be read or is unlimited.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What one transfer holds while it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Want {
    pub bytes: u64,
    pub descriptors: u64,
}

/// Bytes a receiver holds per chunk checked by CRC32C, at most, whichever transport: the
/// CRC32C its frame or message carried (4), the landed CRC32Cs and failure lists of a
/// round (4 each, with a vector's slack up to twice that), a resend list and its
/// encoding (4 + 4), the repaired chunks with their attempts (8). Counted by admission
/// with the data, so chunks of a few bytes cannot cost many times what `--max-memory`
/// allows (1-byte chunks: 48 bytes of books per byte of data).
pub const CHECKED_CHUNK_BOOKS: u64 = 48;
/// Bytes a receiver holds per chunk of a striped transfer, at most (on top of a checked
/// chunk's): its slot in the round's table (a locked place, 32 on 64-bit) and the
/// missing-chunk list, the request and its encoding (4 + 4 + 4), with slack.
pub const STRIPED_CHUNK_BOOKS: u64 = 64;

/// The per-chunk bookkeeping of an offer: `chunks` chunks of `per_chunk` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Books {
    pub chunks: u64,
    pub per_chunk: u64,
}

impl Books {
    /// The books of `chunks` chunks, checked by checksum or not, striped or not (an
    /// unchecked, unstriped transfer keeps no books per chunk: its readers take a
    /// bounded batch of chunks at a time).
    pub fn of(chunks: u64, checked: bool, striped: bool) -> Books {
        let per_chunk = if checked { CHECKED_CHUNK_BOOKS } else { 0 }
            + if striped { STRIPED_CHUNK_BOOKS } else { 0 };
        Books { chunks, per_chunk }
    }

    pub fn bytes(&self) -> u64 {
        self.chunks.saturating_mul(self.per_chunk)
    }
}

/// What is held right now (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    pub connections: usize,
    pub bytes: u64,
    pub handshakes: usize,
    pub descriptors: u64,
    /// Connections kept between their transfers ([`KeptSlot`]s).
    pub kept: usize,
}

/// Connections kept between transfers at most, all peers together, where
/// `--max-connections` is lower (a library listener serves one transfer at a time, yet
/// several endpoints may each keep theirs).
pub const MIN_KEPT: usize = 16;
/// Kept connections of one address at most, where `--max-per-peer` is lower.
pub const MIN_KEPT_PER_PEER: usize = 4;

#[derive(Debug, Default)]
struct Peer {
    handshakes: usize,
    connections: usize,
    kept: usize,
}

impl Peer {
    fn is_idle(&self) -> bool {
        self.handshakes == 0 && self.connections == 0 && self.kept == 0
    }
}

#[derive(Debug, Default)]
struct State {
    held: Held,
    peers: HashMap<IpAddr, Peer>,
}

/// The shared counters; hand out [`HandshakeSlot`]s and [`Lease`]s.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    state: Mutex<State>,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::default(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The counters stay consistent under every operation (each is one short update),
        // so a panic elsewhere while holding the lock leaves nothing half done.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn held(&self) -> Held {
        self.lock().held
    }

    /// May a socket from `peer` start its handshake (read its first message)? It holds
    /// one descriptor until the slot is dropped.
    pub fn handshake(self: &Arc<Self>, peer: IpAddr) -> Result<HandshakeSlot, RejectReason> {
        let peer = peer_key(peer);
        let l = self.limits;
        let mut s = self.lock();
        let held = s.held;
        if held.handshakes >= l.max_handshakes {
            return Err(RejectReason::BusyHandshakes {
                active: held.handshakes as u64,
                max: l.max_handshakes as u64,
            });
        }
        let mine = s.peers.get(&peer).map_or(0, |p| p.handshakes);
        if mine >= l.max_handshakes_per_peer {
            // Its own reason: this cap is fixed, and naming --max-per-peer (which sets
            // the transfers' share) would send the user to an option that does not help.
            return Err(RejectReason::BusyPeerHandshakes {
                active: mine as u64,
                max: l.max_handshakes_per_peer as u64,
            });
        }
        if held.descriptors.saturating_add(1) > l.max_descriptors {
            return Err(RejectReason::BusyDescriptors {
                wanted: 1,
                max: l.max_descriptors,
            });
        }
        s.held.handshakes += 1;
        s.held.descriptors += 1;
        s.peers.entry(peer).or_default().handshakes += 1;
        Ok(HandshakeSlot {
            admission: self.clone(),
            peer,
        })
    }

    /// May a transfer from `peer` holding `want` be served now? Checked in the order a
    /// sender can act on: connections, this peer's share, memory, descriptors.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, want: Want) -> Result<Lease, RejectReason> {
        let peer = peer_key(peer);
        let l = self.limits;
        let mut s = self.lock();
        let held = s.held;
        if held.connections >= l.max_connections {
            return Err(RejectReason::BusyConnections {
                active: held.connections as u64,
                max: l.max_connections as u64,
            });
        }
        let mine = s.peers.get(&peer).map_or(0, |p| p.connections);
        if mine >= l.max_per_peer {
            return Err(RejectReason::BusyPeer {
                active: mine as u64,
                max: l.max_per_peer as u64,
            });
        }
        if held.bytes.saturating_add(want.bytes) > l.max_memory {
            return Err(RejectReason::BusyMemory {
                wanted: want.bytes,
                max: l.max_memory,
            });
        }
        if held.descriptors.saturating_add(want.descriptors) > l.max_descriptors {
            return Err(RejectReason::BusyDescriptors {
                wanted: want.descriptors,
                max: l.max_descriptors,
            });
        }
        s.held.connections += 1;
        s.held.bytes += want.bytes;
        s.held.descriptors += want.descriptors;
        s.peers.entry(peer).or_default().connections += 1;
        Ok(Lease {
            admission: self.clone(),
            peer,
            want,
        })
    }

    /// [`admit`](Self::admit) for an offer of `want` whose chunks keep `books`: the
    /// books are memory as the buffers are, counted with them under `--max-memory`. An
    /// offer whose data fits `--max-memory` but not with its books never can (however
    /// idle the receiver): refused with [`RejectReason::ChunkBooks`], which says to use
    /// larger chunks, not to try again later.
    pub fn admit_offer(
        self: &Arc<Self>,
        peer: IpAddr,
        want: Want,
        books: Books,
    ) -> Result<Lease, RejectReason> {
        let max = self.limits.max_memory;
        let with_books = want.bytes.saturating_add(books.bytes());
        if want.bytes <= max && with_books > max {
            return Err(RejectReason::ChunkBooks {
                chunks: books.chunks,
                per_chunk: books.per_chunk,
                max,
            });
        }
        self.admit(
            peer,
            Want {
                bytes: with_books,
                ..want
            },
        )
    }

    /// May a connection of `peer` that holds `descriptors` be kept open after its
    /// transfer, for the sender's next offer? A kept connection holds its sockets and
    /// reader threads while it waits, outside the transfers' count, so it has counts of
    /// its own: at most `--max-connections` (at least [`MIN_KEPT`]) kept at once, at most
    /// `--max-per-peer` (at least [`MIN_KEPT_PER_PEER`]) of one address, and their
    /// descriptors within the budget. `None`: close it after the transfer (its sender
    /// opens a new one for the next). Without these, one peer kept a connection per
    /// transfer, and 60 transfers of 64 streams left a receiver holding 3,900 threads
    /// and as many sockets within a second.
    pub fn keep(self: &Arc<Self>, peer: IpAddr, descriptors: u64) -> Option<KeptSlot> {
        let peer = peer_key(peer);
        let l = self.limits;
        let mut s = self.lock();
        let held = s.held;
        let mine = s.peers.get(&peer).map_or(0, |p| p.kept);
        let room = held.kept < l.max_connections.max(MIN_KEPT)
            && mine < l.max_per_peer.max(MIN_KEPT_PER_PEER)
            && held.descriptors.saturating_add(descriptors) <= l.max_descriptors;
        if !room {
            return None;
        }
        s.held.kept += 1;
        s.held.descriptors += descriptors;
        s.peers.entry(peer).or_default().kept += 1;
        Some(KeptSlot {
            admission: self.clone(),
            peer,
            descriptors,
        })
    }

    fn release_kept(&self, peer: IpAddr, descriptors: u64) {
        let mut s = self.lock();
        s.held.kept -= 1;
        s.held.descriptors -= descriptors;
        if let Some(p) = s.peers.get_mut(&peer) {
            p.kept -= 1;
            if p.is_idle() {
                s.peers.remove(&peer);
            }
        }
    }

    fn release(&self, peer: IpAddr, handshakes: usize, connections: usize, want: Want) {
        let mut s = self.lock();
        s.held.handshakes -= handshakes;
        s.held.connections -= connections;
        s.held.bytes -= want.bytes;
        s.held.descriptors -= want.descriptors;
        if let Some(p) = s.peers.get_mut(&peer) {
            p.handshakes -= handshakes;
            p.connections -= connections;
            if p.is_idle() {
                // Only addresses holding something are remembered: the map is bounded
                // by the handshakes and connections themselves.
                s.peers.remove(&peer);
            }
        }
    }
}

/// A handshake in progress (one socket reading its first message).
#[derive(Debug)]
pub struct HandshakeSlot {
    admission: Arc<Admission>,
    peer: IpAddr,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let one = Want {
            bytes: 0,
            descriptors: 1,
        };
        self.admission.release(self.peer, 1, 0, one);
    }
}

/// A transfer being served, holding its share until dropped.
#[derive(Debug)]
pub struct Lease {
    admission: Arc<Admission>,
    peer: IpAddr,
    want: Want,
}

impl Lease {
    pub fn want(&self) -> Want {
        self.want
    }

    /// [`Admission::keep`] for this transfer's connection, once it is done.
    pub fn keep(&self, descriptors: u64) -> Option<KeptSlot> {
        self.admission.keep(self.peer, descriptors)
    }
}

/// A connection kept between its transfers, counted until dropped.
#[derive(Debug)]
pub struct KeptSlot {
    admission: Arc<Admission>,
    peer: IpAddr,
    descriptors: u64,
}

impl Drop for KeptSlot {
    fn drop(&mut self) {
        self.admission.release_kept(self.peer, self.descriptors);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.admission.release(self.peer, 0, 1, self.want);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 2,
            max_memory: 100,
            max_handshakes: 3,
            max_handshakes_per_peer: 2,
            max_per_peer: 1,
            max_descriptors: 10,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    fn want(bytes: u64, descriptors: u64) -> Want {
        Want { bytes, descriptors }
    }

    #[test]
    fn a_receivers_limits_and_the_open_files_limit() {
        let n = open_files_limit().expect("/proc/self/limits names the open-files limit");
        assert!(n >= 64, "{n}");
        let l = Limits::receiver(true, 16, 1 << 30, 8);
        assert_eq!((l.max_connections, l.max_per_peer), (1, 8));
        assert_eq!(l.max_descriptors, n - SPARE_DESCRIPTORS);
        const { assert!(MAX_HANDSHAKES_PER_PEER > 64 && MAX_HANDSHAKES_PER_PEER < MAX_HANDSHAKES) };
    }

    #[test]
    fn kept_connections_are_capped_in_all_per_peer_and_by_descriptors() {
        let many = Limits {
            max_descriptors: 1000,
            ..limits()
        };
        let a = Admission::new(many);
        // One address: at least MIN_KEPT_PER_PEER, though --max-per-peer is 1.
        let mine: Vec<_> = (0..MIN_KEPT_PER_PEER)
            .map(|_| a.keep(A, 9).expect("room for A"))
            .collect();
        assert!(a.keep(A, 9).is_none(), "A over its share");
        // All addresses: at least MIN_KEPT, though --max-connections is 2.
        let others: Vec<_> = (0..MIN_KEPT - MIN_KEPT_PER_PEER)
            .map(|k| {
                let peer = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, k as u8));
                a.keep(peer, 9).expect("room for another address")
            })
            .collect();
        assert!(a.keep(B, 9).is_none(), "over all");
        assert_eq!(a.held().kept, MIN_KEPT);
        assert_eq!(a.held().descriptors, 9 * MIN_KEPT as u64);
        // Transfers are not counted against them, nor they against transfers.
        let lease = a.admit(B, want(10, 2)).unwrap();
        drop((mine, others));
        assert_eq!(a.held().kept, 0);
        assert_eq!(a.held().descriptors, 2);
        // Descriptors: a connection whose sockets do not fit is not kept.
        assert!(a.keep(B, 999).is_none());
        let kept = lease
            .keep(998)
            .expect("the lease's peer, within the budget");
        drop(lease);
        drop(kept);
        assert_eq!(a.held(), Held::default());
    }

    #[test]
    fn handshakes_are_capped_in_all_and_per_peer_and_given_back() {
        let a = Admission::new(limits());
        let h1 = a.handshake(A).unwrap();
        let _h2 = a.handshake(A).unwrap();
        let busy = a.handshake(A).unwrap_err();
        assert_eq!(busy, RejectReason::BusyPeerHandshakes { active: 2, max: 2 });
        let words = busy.to_string();
        assert!(
            words.contains("2 sockets in their handshake, its limit per address 2")
                && words.contains("not --max-per-peer"),
            "{words}"
        );
        let _h3 = a.handshake(B).unwrap();
        assert_eq!(
            a.handshake(B).unwrap_err(),
            RejectReason::BusyHandshakes { active: 3, max: 3 }
        );
        drop(h1);
        let _h4 = a.handshake(A).expect("a dropped slot is free again");
        assert_eq!(a.held().handshakes, 3);
    }

    #[test]
    fn an_ipv4_peer_on_a_dual_stack_socket_is_the_same_peer() {
        let a = Admission::new(limits());
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let _h1 = a.handshake(A).unwrap();
        let _h2 = a.handshake(mapped).unwrap();
        assert!(matches!(
            a.handshake(A),
            Err(RejectReason::BusyPeerHandshakes { .. })
        ));
    }

    #[test]
    fn leases_count_connections_bytes_descriptors_and_the_peers_share() {
        let a = Admission::new(limits());
        let l1 = a.admit(A, want(60, 3)).unwrap();
        assert_eq!(
            a.admit(A, want(1, 1)).unwrap_err(),
            RejectReason::BusyPeer { active: 1, max: 1 }
        );
        assert_eq!(
            a.admit(B, want(41, 1)).unwrap_err(),
            RejectReason::BusyMemory {
                wanted: 41,
                max: 100
            }
        );
        assert_eq!(
            a.admit(B, want(40, 8)).unwrap_err(),
            RejectReason::BusyDescriptors { wanted: 8, max: 10 }
        );
        let l2 = a.admit(B, want(40, 7)).unwrap();
        assert_eq!(
            a.held(),
            Held {
                connections: 2,
                bytes: 100,
                handshakes: 0,
                descriptors: 10,
                kept: 0,
            }
        );
        assert!(matches!(
            a.handshake(B),
            Err(RejectReason::BusyDescriptors { .. })
        ));
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        assert_eq!(
            a.admit(c, want(0, 0)).unwrap_err(),
            RejectReason::BusyConnections { active: 2, max: 2 }
        );
        drop((l1, l2));
        assert_eq!(a.held(), Held::default());
        assert!(a.lock().peers.is_empty(), "idle peers are forgotten");
    }

    #[test]
    fn an_offers_chunk_books_count_with_its_data_and_one_that_never_fits_says_so() {
        let a = Admission::new(limits()); // 100 bytes of memory
        let books = |chunks| Books {
            chunks,
            per_chunk: 4,
        };
        // 40 bytes of data in 10 chunks: 80 bytes in all.
        let l1 = a.admit_offer(A, want(40, 1), books(10)).unwrap();
        assert_eq!(a.held().bytes, 80);
        // 20 of data and 20 of books fit an idle receiver, not this one: busy.
        assert_eq!(
            a.admit_offer(B, want(20, 1), books(5)).unwrap_err(),
            RejectReason::BusyMemory {
                wanted: 40,
                max: 100
            }
        );
        drop(l1);
        // 60 of data fit, with 44 of books never: say so, not "busy".
        assert_eq!(
            a.admit_offer(B, want(60, 1), books(11)).unwrap_err(),
            RejectReason::ChunkBooks {
                chunks: 11,
                per_chunk: 4,
                max: 100
            }
        );
        assert_eq!(a.held(), Held::default());
        // The books' sizes: none without checks or stripes, and no overflow.
        assert_eq!(Books::of(1 << 40, false, false).bytes(), 0);
        assert_eq!(Books::of(10, true, false).bytes(), 10 * CHECKED_CHUNK_BOOKS);
        assert_eq!(
            Books::of(10, true, true).bytes(),
            10 * (CHECKED_CHUNK_BOOKS + STRIPED_CHUNK_BOOKS)
        );
        assert_eq!(Books::of(u64::MAX, true, false).bytes(), u64::MAX);
    }
}
