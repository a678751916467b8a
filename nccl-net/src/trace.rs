//! `NCCL_GRDMA_TRACE=1`: one INFO line per step of each of a comm's first
//! `TRACE_REQUESTS` requests (isend/irecv called, clear-to-send sent and received,
//! first and last byte written and read, ack sent and received, test done), stamped in
//! microseconds since the comm was made and, after `@`, the wall clock's microseconds
//! (the same clock for both ranks on one host, so their lines can be merged), then the
//! comm's number in its process (`[comm 3]`), so that a run under NCCL shows where an
//! operation's time goes. Off (and free) unless set.

use crate::log::{info, NET};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Requests traced per comm (each a handful of lines).
pub const TRACE_REQUESTS: u64 = 200;

#[derive(Clone, Copy, Debug)]
pub struct Trace {
    t0: Option<Instant>,
    /// The comm's number in this process (its lines say `[comm 3]`: NCCL opens a comm
    /// per channel, and each numbers its requests from 0).
    number: u64,
}

/// Comms made in this process, for [`Trace::number`].
static COMMS: AtomicU64 = AtomicU64::new(0);

impl Trace {
    pub fn from_env() -> Self {
        let on = std::env::var("NCCL_GRDMA_TRACE").is_ok_and(|v| v.trim() == "1");
        Self {
            t0: on.then(Instant::now),
            number: COMMS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether request number `n` (0-based, per comm) is traced.
    pub fn on(&self, n: u64) -> bool {
        self.t0.is_some() && n < TRACE_REQUESTS
    }

    /// One line about item `key` (a clear-to-send id, an eager sequence number) of
    /// `comm`, for the first `TRACE_REQUESTS` of them.
    pub fn note(&self, comm: &str, key: u64, what: std::fmt::Arguments<'_>) {
        if let (true, Some(t0)) = (key <= TRACE_REQUESTS, self.t0) {
            let us = t0.elapsed().as_micros();
            info!(NET; "trace {comm} #{key} +{us}us @{} [comm {}] {what}", wall_us(), self.number);
        }
    }

    /// One line for request `n` of `comm` ("send"/"recv"), if traced.
    pub fn event(&self, comm: &str, n: u64, what: std::fmt::Arguments<'_>) {
        if let (true, Some(t0)) = (self.on(n), self.t0) {
            let us = t0.elapsed().as_micros();
            info!(NET; "trace {comm} req {n} +{us}us @{} [comm {}] {what}", wall_us(), self.number);
        }
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn wall_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}
