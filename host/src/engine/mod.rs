//! The transfer engine, written once over any link ([`crate::net`]'s seam): which rail
//! carries each chunk and failover ([`stripe`], [`sending`]), rails that rest after a
//! failure ([`cooldown`]), the sender's transfers and its conversation with the receiver
//! ([`send`]), the receiver's passes, checks, converging repair, acks and reports
//! ([`receiving`], [`recv`]; what it stores checked again where the peer writes in
//! place, `checked_out`), the serving loop ([`serve`]) with where transfers land
//! ([`recv_memory`]) and the offers of kept connections ([`kept_offers`]), the sender's [`offer`],
//! opening a connection over each transport ([`connect`]), and a sender's TCP
//! connection kept for its next transfer ([`kept`]). One options value per direction
//! ([`options`]), with the caller's [`cancel`] token.
//! Nothing below it imports it.

/// The caller's cancel token (it lives with the transfer's other parts, below the links,
/// which look at it too).
pub use crate::transfer::cancel;
mod checked_out;
pub mod connect;
pub mod cooldown;
pub mod inbox;
pub mod kept;
pub mod kept_offers;
pub mod landed;
#[cfg(test)]
mod memlink;
pub mod offer;
pub mod options;
pub mod receiving;
pub mod recv;
pub mod recv_memory;
pub mod send;
pub mod sending;
pub mod serve;
pub mod serve_offer;
pub mod stripe;

pub use cancel::Cancel;
pub use cooldown::Cooldowns;
pub use options::{
    RecvOptions, SendOptions, TcpSendOptions, VerbsSendOptions, DEFAULT_RAIL_TIMEOUT,
};
pub use serve::RecvMemory;
