//! Where a receiver's listener sends the further members of a connection it is already
//! serving: a TCP stream after the first, a verbs rail after rail 0. The transfer's
//! thread opens a slot under the connection's token (the sender's, over TCP; a fresh
//! one of the receiver's, over verbs, sent back in its accept) and takes its members
//! from the slot's receiver; the listener routes each member by the token it names,
//! after checking it fits (a member index below the count, each once, the count the
//! offer said, from the offer's address where that is required). Both transports use
//! this one book.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

/// Most members of one connection (bits of a mask).
pub const MAX_MEMBERS: u16 = 64;

/// Why a member was not routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No connection of that token is served (any more), or it has all its members.
    Unknown,
    /// That member index joined already, or it is not below the count.
    BadMember { member: u16, members: u16 },
    /// The member says another count than the connection's offer.
    OtherCount { said: u16, members: u16 },
    /// From another address than the connection's offer, where that must match.
    OtherAddress,
    /// The token is taken by another connection being served.
    TokenInUse,
}

impl Refused {
    /// In words, for the receiver's line and the reject.
    pub fn words(self) -> &'static str {
        match self {
            Refused::Unknown => {
                "a member of a connection this receiver does not serve (or that has all its members)"
            }
            Refused::BadMember { .. } => "a member index that repeats or is beyond the count",
            Refused::OtherCount { .. } => "a member whose count differs from its offer's",
            Refused::OtherAddress => "a member from another address than its connection's offer",
            Refused::TokenInUse => "a connection token already in use",
        }
    }
}

struct Slot<T> {
    members: u16,
    /// Members in (bit `m`), member 0 being the connection's first.
    joined: u64,
    /// Members must come from this address (`None`: from any, as striped rails do).
    only_from: Option<IpAddr>,
    tx: mpsc::Sender<(u16, T)>,
}

/// The slots of the connections a receiver is serving.
pub struct Joins<T> {
    slots: Mutex<HashMap<u64, Slot<T>>>,
}

impl<T> Default for Joins<T> {
    fn default() -> Self {
        Joins {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

/// A connection's slot: its members arrive on `rx` as (member index, value). Closed
/// when dropped (members that come later are refused as unknown).
pub struct JoinSlot<T> {
    joins: Arc<Joins<T>>,
    /// Whether a slot was made (a connection of one member needs none): only then is
    /// the token this connection's to give back.
    registered: bool,
    pub token: u64,
    pub rx: mpsc::Receiver<(u16, T)>,
}

impl<T> Drop for JoinSlot<T> {
    fn drop(&mut self) {
        if self.registered {
            self.joins.lock().remove(&self.token);
        }
    }
}

impl<T> Joins<T> {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot<T>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection of `members` members (the first one in already) under
    /// `token`, or a fresh random one (never 0) when `None`; members from `only_from`
    /// alone where given.
    pub fn open(
        self: &Arc<Self>,
        token: Option<u64>,
        members: u16,
        only_from: Option<IpAddr>,
    ) -> Result<JoinSlot<T>, Refused> {
        let (tx, rx) = mpsc::channel();
        let mut slots = self.lock();
        let token = match token {
            Some(t) if slots.contains_key(&t) => return Err(Refused::TokenInUse),
            Some(t) => t,
            None => loop {
                let t = fresh_token();
                if t != 0 && !slots.contains_key(&t) {
                    break t;
                }
            },
        };
        let registered = members > 1;
        if registered {
            slots.insert(
                token,
                Slot {
                    members: members.min(MAX_MEMBERS),
                    joined: 1,
                    only_from,
                    tx,
                },
            );
        }
        Ok(JoinSlot {
            joins: self.clone(),
            registered,
            token,
            rx,
        })
    }

    /// Hand `value` (member `member` of `members`, from `from`) to the connection
    /// `token` names, or say why not (the value back, to be refused).
    pub fn route(
        &self,
        token: u64,
        member: u16,
        members: u16,
        from: IpAddr,
        value: T,
    ) -> Result<(), (Refused, T)> {
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(&token) else {
            return Err((Refused::Unknown, value));
        };
        let why = if slot.only_from.is_some_and(|ip| ip != from) {
            Some(Refused::OtherAddress)
        } else if members != slot.members {
            Some(Refused::OtherCount {
                said: members,
                members: slot.members,
            })
        } else if member >= slot.members || slot.joined & (1u64 << member) != 0 {
            Some(Refused::BadMember {
                member,
                members: slot.members,
            })
        } else {
            None
        };
        if let Some(why) = why {
            return Err((why, value));
        }
        match slot.tx.send((member, value)) {
            Ok(()) => {
                slot.joined |= 1u64 << member;
                if slot.joined.count_ones() == slot.members as u32 {
                    slots.remove(&token);
                }
                Ok(())
            }
            // The connection's thread is gone.
            Err(mpsc::SendError((_, value))) => {
                slots.remove(&token);
                Err((Refused::Unknown, value))
            }
        }
    }
}

/// A random token (the receiver's, for a verbs striped accept).
fn fresh_token() -> u64 {
    let mut word = [0u8; 8];
    match crate::server::key::fresh_nonce() {
        Ok(nonce) => word.copy_from_slice(&nonce[..8]),
        // No randomness from the system: the time and a counter still keep tokens apart
        // within the process (a token is an address, not a secret).
        Err(_) => {
            use std::sync::atomic::{AtomicU64, Ordering};
            static N: AtomicU64 = AtomicU64::new(1);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            word = (t ^ N.fetch_add(1, Ordering::Relaxed).rotate_left(32)).to_le_bytes();
        }
    }
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn members_reach_their_connection_and_lying_ones_are_refused_by_name() {
        let joins = Arc::new(Joins::<u32>::default());
        let slot = joins.open(None, 3, None).unwrap();
        let a = ip("10.0.0.1");
        joins.route(slot.token, 1, 3, a, 11).unwrap();
        assert_eq!(slot.rx.try_recv(), Ok((1, 11)));
        let (why, back) = joins.route(slot.token, 1, 3, a, 12).unwrap_err();
        assert_eq!(back, 12);
        assert_eq!(
            why,
            Refused::BadMember {
                member: 1,
                members: 3
            },
            "twice"
        );
        let (why, _) = joins.route(slot.token, 2, 4, a, 13).unwrap_err();
        assert_eq!(
            why,
            Refused::OtherCount {
                said: 4,
                members: 3
            }
        );
        let (why, _) = joins.route(slot.token, 3, 3, a, 13).unwrap_err();
        assert!(
            matches!(why, Refused::BadMember { member: 3, .. }),
            "beyond"
        );
        let (why, _) = joins.route(slot.token ^ 1, 2, 3, a, 14).unwrap_err();
        assert_eq!(why, Refused::Unknown);
        // The last member closes the slot: nothing more may join.
        joins.route(slot.token, 2, 3, a, 15).unwrap();
        let (why, _) = joins.route(slot.token, 2, 3, a, 16).unwrap_err();
        assert_eq!(why, Refused::Unknown);
    }

    #[test]
    fn a_senders_token_is_kept_unless_in_use_and_the_address_can_be_required() {
        let joins = Arc::new(Joins::<u8>::default());
        let from = ip("10.0.0.1");
        let slot = joins.open(Some(42), 2, Some(from)).unwrap();
        assert_eq!(slot.token, 42);
        assert!(matches!(
            joins.open(Some(42), 2, None),
            Err(Refused::TokenInUse)
        ));
        let (why, _) = joins.route(42, 1, 2, ip("10.0.0.9"), 1).unwrap_err();
        assert_eq!(why, Refused::OtherAddress);
        joins.route(42, 1, 2, from, 2).unwrap();
        drop(slot);
        assert!(joins.open(Some(42), 2, None).is_ok(), "given back");
    }

    #[test]
    fn a_closed_slot_refuses_its_members() {
        let joins = Arc::new(Joins::<u8>::default());
        let slot = joins.open(None, 2, None).unwrap();
        let token = slot.token;
        assert_ne!(token, 0);
        drop(slot);
        let (why, _) = joins.route(token, 1, 2, ip("10.0.0.1"), 0).unwrap_err();
        assert_eq!(why, Refused::Unknown);
    }
}
