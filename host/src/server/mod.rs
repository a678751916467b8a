//! What every receiver shares, whatever carries the bytes: who may send ([`allow`],
//! [`key`]) and how much may be held at once ([`admission`]). The verbs receiver
//! (`transport::rdma::receiver`) and the TCP receiver (`transport::tcp::receiver`) ask
//! the same questions here, in the same order, before they allocate anything for a peer:
//!
//! 1. Is the peer's address allowed (`--allow`)?
//! 2. May another handshake start (all peers together, and this peer)?
//! 3. With `--key-file`: does the offer carry a proof of the key over a fresh nonce?
//! 4. May the offer be served now (connections, bytes held, descriptors, this peer's
//!    share)? The answer is a [`admission::Lease`] that gives its share back when the
//!    transfer ends, however it ends.

pub mod admission;
pub mod allow;
pub mod key;

pub use admission::{Admission, HandshakeSlot, Lease, Limits, Want};
pub use allow::AllowList;
pub use key::Key;
