//! What every receiver shares, whatever carries the bytes: who may send ([`allow`],
//! [`key`]) and how much may be held at once ([`admission`]). The verbs listener
//! (`net::verbs::listen`) and the TCP one (`net::tcp::listen`), under the engine's
//! serving loop (`engine::serve`), ask the same questions here, in the same order,
//! before they allocate anything for a peer:
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

use std::time::{Duration, Instant};

/// With `--min-rate`, when transfer `k` (from 0) of a connection must be done: the rate
/// counts over the connection since its accept, `(k + 1) × total` bytes within
/// `--timeout + (k + 1) × total / rate`, so a `--reuse-connection` peer cannot hold a
/// slot by sending one small transfer now and then. `None` without a rate.
pub fn whole_deadline(
    accepted_at: Instant,
    timeout: Duration,
    min_rate: u64,
    total: u64,
    k: u64,
) -> Option<Instant> {
    (min_rate > 0).then(|| {
        let bytes = total as f64 * (k as f64 + 1.0);
        let allowed = (bytes / min_rate as f64).min(1e9);
        accepted_at + timeout + Duration::from_secs_f64(allowed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_over_the_connection() {
        let t0 = Instant::now();
        let d = |k| whole_deadline(t0, Duration::from_secs(10), 1 << 20, 4 << 20, k).unwrap() - t0;
        assert_eq!(d(0), Duration::from_secs(14));
        assert_eq!(
            d(9),
            Duration::from_secs(50),
            "10 × 4 MiB at 1 MiB/s, plus 10 s"
        );
        assert_eq!(
            whole_deadline(t0, Duration::from_secs(10), 0, 4 << 20, 0),
            None
        );
    }
}
