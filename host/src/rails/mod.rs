//! Rails: every RDMA port of this machine, ranked for each GPU (issue #19, part 1).
//!
//! A GPU server has one NIC per GPU or more, and a GPU whose data goes out through the
//! wrong one loses bandwidth (its reads cross the CPU, or two GPUs share one NIC while
//! another idles). The topology facts are read from sysfs ([`sysfs`]), ranked per GPU
//! and spread over the GPUs that share rails ([`mod@rank`]), chosen from the command line
//! ([`select`]), and paired with the receiver's rails ([`pairing`]). All but the
//! gatherer are pure functions, tested on fixture trees of a DGX-like and a
//! GB200-like machine (`fixtures.rs`).
//!
//! Striping one transfer over the set, and failing over, are the engine's (`engine::stripe`),
//! over either link (verbs: a queue pair per rail, joined by token, `net::verbs::dial`;
//! TCP: streams per rail, `net::tcp::dial`); otherwise a transfer uses the first rail of
//! its set.

pub mod pairing;
pub mod rank;
pub mod select;
pub mod sysfs;
pub mod words;

#[cfg(test)]
mod fixtures;

pub use pairing::{peer_rails, Reachability};
pub use rank::{chosen, default_rails, order_for_gpus, rank, rank_for_gpu, RankedRail};
pub use select::{
    parse_nic_list, resolve_nic_list, several_rails_note, take_rails, NicList, NicSpec,
};
pub use sysfs::{gather, PortState, Rail, RailId};
