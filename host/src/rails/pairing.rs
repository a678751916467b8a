//! Which receiver rails a sender rail may talk to.
//!
//! Rail-optimized and rail-only fabrics wire NIC k of every node to the same leaf
//! switch (rail k), so NIC k reaches NIC k of another node in one hop, and on a rail-only
//! fabric nothing else at all. So the rule is: rail k of the sender pairs with rail k of
//! the receiver, k counted in each machine's order ([`RailId::machine_order`]), unless
//! the receiver says that any of its rails can be reached from any of the sender's.
//!
//! Nothing carries that statement over the wire yet: [`Reachability`] is a value the
//! caller supplies, and the pairing is a pure function of it.

use super::sysfs::{Rail, RailId};
use serde::Serialize;

/// What the receiver's fabric allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reachability {
    /// Rail k talks to rail k only (the safe assumption).
    RailOnly,
    /// Any rail reaches any rail (a fat tree, or one switch).
    AnyToAny,
}

/// Rail k's index in a machine's rails (sorted in the machine's order, as
/// [`super::sysfs::gather`] returns them).
pub fn rail_index(rails: &[Rail], id: &RailId) -> Option<usize> {
    rails.iter().position(|r| r.id() == *id)
}

/// The receiver rails that the sender's rail `sender` (from the sender's `sender_rails`)
/// may use, in the receiver's order: rail k alone when rail-only, every active one when
/// any-to-any. An error says why there is none.
pub fn peer_rails(
    sender: &RailId,
    sender_rails: &[Rail],
    receiver_rails: &[Rail],
    reach: Reachability,
) -> Result<Vec<RailId>, String> {
    let up = |r: &&Rail| r.state.is_up();
    match reach {
        Reachability::AnyToAny => {
            let all: Vec<RailId> = receiver_rails.iter().filter(up).map(Rail::id).collect();
            if all.is_empty() {
                Err("the receiver has no ACTIVE rail".into())
            } else {
                Ok(all)
            }
        }
        Reachability::RailOnly => {
            let k = rail_index(sender_rails, sender)
                .ok_or_else(|| format!("{sender} is not one of the sender's rails"))?;
            let theirs = receiver_rails.get(k).ok_or_else(|| {
                format!(
                    "{sender} is rail {k} of the sender; the receiver has {} rail{} (0..{}), and on a rail-only fabric rail k reaches only rail k",
                    receiver_rails.len(),
                    if receiver_rails.len() == 1 { "" } else { "s" },
                    receiver_rails.len().saturating_sub(1)
                )
            })?;
            if !theirs.state.is_up() {
                return Err(format!(
                    "{sender} is rail {k}; the receiver's rail {k}, {}, is {}, and on a rail-only fabric rail k reaches only rail k",
                    theirs.id(),
                    theirs.state.name()
                ));
            }
            Ok(vec![theirs.id()])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rails::sysfs::PortState;
    use crate::rdma::NicLocation;

    fn rails(names: &[(&str, PortState)]) -> Vec<Rail> {
        names
            .iter()
            .map(|(d, s)| Rail {
                device: d.to_string(),
                port: 1,
                state: s.clone(),
                rate: None,
                gbit_per_s: None,
                link_layer: None,
                location: NicLocation::Software,
            })
            .collect()
    }

    fn id(d: &str) -> RailId {
        RailId {
            device: d.into(),
            port: 1,
        }
    }

    #[test]
    fn rail_k_pairs_with_rail_k_unless_any_to_any() {
        use PortState::*;
        let sender = rails(&[("mlx5_0", Active), ("mlx5_1", Active), ("mlx5_2", Active)]);
        // The receiver's devices have other names; the index counts.
        let receiver = rails(&[("ib0", Active), ("ib1", Down), ("ib2", Active)]);
        let pair = |s: &str, reach| peer_rails(&id(s), &sender, &receiver, reach);
        assert_eq!(pair("mlx5_2", Reachability::RailOnly), Ok(vec![id("ib2")]));
        assert_eq!(pair("mlx5_0", Reachability::RailOnly), Ok(vec![id("ib0")]));
        assert_eq!(
            pair("mlx5_1", Reachability::RailOnly).unwrap_err(),
            "mlx5_1:1 is rail 1; the receiver's rail 1, ib1:1, is DOWN, and on a rail-only fabric rail k reaches only rail k"
        );
        assert_eq!(
            pair("mlx5_1", Reachability::AnyToAny),
            Ok(vec![id("ib0"), id("ib2")])
        );
        let small = rails(&[("ib0", Active)]);
        assert_eq!(
            peer_rails(&id("mlx5_2"), &sender, &small, Reachability::RailOnly).unwrap_err(),
            "mlx5_2:1 is rail 2 of the sender; the receiver has 1 rail (0..0), and on a rail-only fabric rail k reaches only rail k"
        );
        assert!(
            peer_rails(&id("mlx5_9"), &sender, &receiver, Reachability::RailOnly)
                .unwrap_err()
                .contains("not one of the sender's rails")
        );
        assert_eq!(
            peer_rails(
                &id("mlx5_0"),
                &sender,
                &rails(&[("ib0", Down)]),
                Reachability::AnyToAny
            )
            .unwrap_err(),
            "the receiver has no ACTIVE rail"
        );
    }
}
