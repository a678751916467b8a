//! A caller's way to stop its transfer: a token it holds and cancels (Ctrl-C in Python,
//! a [`Pending`](crate::api::Pending) given up). The engine looks at it at every poll of
//! the link, at least every [`CANCEL_POLL`], and ends the transfer as a failure of its
//! own ("cancelled by the caller"): the connection is broken off (the peer reads a
//! reset, never a verdict), and the call returns once no thread touches the caller's
//! memory any more, as after any failure. A receiver's wait for a sender looks at it
//! too (the serving loop), and so does a TCP sender's wait for the answer to its offer;
//! not looked at: connecting (bounded by the rail's connect timeout) and a verbs
//! connection's opening (by `--timeout`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The words of a cancelled transfer's error (the kind of a library error is read from
/// them).
pub const CANCELLED: &str = "cancelled by the caller";

/// How long a cancel may go unnoticed by a transfer waiting on its link.
pub const CANCEL_POLL: Duration = Duration::from_millis(50);

/// A cancel token: clones share it; once cancelled, it stays so.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Stop the transfers that hold this token (at their next look).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Whether `cancel` is there and cancelled.
pub fn cancelled(cancel: &Option<Cancel>) -> bool {
    cancel.as_ref().is_some_and(Cancel::is_cancelled)
}

/// `wait`, cut to [`CANCEL_POLL`] where there is a token to look at.
pub fn bounded(wait: Duration, cancel: &Option<Cancel>) -> Duration {
    match cancel {
        Some(_) => wait.min(CANCEL_POLL),
        None => wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_a_cancel_and_waits_are_cut_only_with_a_token() {
        let c = Cancel::new();
        let held = Some(c.clone());
        assert!(!cancelled(&held));
        c.cancel();
        assert!(cancelled(&held));
        assert!(!cancelled(&None));
        assert_eq!(bounded(Duration::from_secs(9), &held), CANCEL_POLL);
        assert_eq!(
            bounded(Duration::from_secs(9), &None),
            Duration::from_secs(9)
        );
    }
}
