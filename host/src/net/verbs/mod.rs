//! The verbs transport: RC queue pairs through librdmacm and libibverbs (the thin
//! wrappers of [`crate::rdma`]), as a link of the wire seam ([`crate::net`]).
//!
//! - [`open`]: a sender's route, connect and memory; [`dial`]: its rails opened, the
//!   offer, the joins, the link run and closed.
//! - [`listen`]: the receiver's CM listener (admission's first checks, keys, joins);
//!   [`accept`]: an admitted offer answered and its link run; [`rail`]: a receiver's
//!   rail (how items land on it, its slots, its accept), rail 0 and the joins alike.
//! - [`send`] and [`recv`]: the two ends of a link (work requests, immediates, receive
//!   layout, slots); [`conn`]: one queue pair and its slots; [`messages`]: control
//!   messages cut into slot-sized fragments.
//! - [`raw`]: the seed's wire behaviour (`--raw`), one message and a reply.
//!
//! Everything else (chunk plan and window, striping and failover, checksums and repair,
//! the receive and serve loops) is the engine's, the same as over TCP.

pub mod accept;
pub mod conn;
pub mod dial;
pub mod listen;
pub mod messages;
pub mod open;
pub mod rail;
pub mod raw;
pub mod recv;
pub mod send;

/// `HOST_VERBS_TRACE=1`: one line on stderr per work request posted and per completion
/// taken, with the time since the first line (as NCCL_DEBUG=TRACE does for its
/// transports), for finding out where a verbs connection waits.
pub(crate) fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HOST_VERBS_TRACE").is_some_and(|v| v == "1"))
}

/// The time since the first trace line.
pub(crate) fn trace_time() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::net::verbs::tracing() {
            eprintln!("[verbs {:10.6}] {}", $crate::net::verbs::trace_time(), format!($($arg)*));
        }
    };
}
pub(crate) use trace;
