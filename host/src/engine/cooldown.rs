//! Rails that failed rest before they are tried again: a value the caller owns and
//! passes to every transfer that should remember (the CLI one per process, the
//! library's endpoint one per endpoint), never a process-wide global.
//!
//! A rail that failed (its link went down, or it went quiet for `--rail-timeout` while
//! another rail was well) is left out of the transfers that start within its cooldown:
//! 1 s after its first failure, doubling with each failure in a row up to 60 s. Once the
//! cooldown is over it is tried again, and a transfer it carries to the end clears its
//! record. Rails are named by their labels (a local address, an RDMA device).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The first cooldown, and the longest.
const FIRST_COOLDOWN: Duration = Duration::from_secs(1);
const MAX_COOLDOWN: Duration = Duration::from_secs(60);

/// The cooldown after `failures` failures in a row: 1 s, 2 s, 4 s, ... at most 60 s.
pub fn cooldown(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    (FIRST_COOLDOWN * (1u32 << doublings)).min(MAX_COOLDOWN)
}

/// A rail's record of failures in a row.
#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    until: Instant,
}

/// Failures in a row per rail label. Cloning shares the records.
#[derive(Debug, Clone, Default)]
pub struct Cooldowns(Arc<Mutex<HashMap<String, Record>>>);

impl Cooldowns {
    pub fn new() -> Cooldowns {
        Cooldowns::default()
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is left of `label`'s cooldown at `now` (`None`: it may carry chunks).
    pub fn resting(&self, label: &str, now: Instant) -> Option<Duration> {
        let left = self.map().get(label)?.until.checked_duration_since(now)?;
        (!left.is_zero()).then_some(left)
    }

    /// `label` failed at `now`: its cooldown, doubled from the last one.
    pub fn failed(&self, label: &str, now: Instant) -> Duration {
        let mut map = self.map();
        let failures = map.get(label).map_or(0, |r| r.failures) + 1;
        let rest = cooldown(failures);
        map.insert(
            label.to_string(),
            Record {
                failures,
                until: now + rest,
            },
        );
        rest
    }

    /// `label` carried a transfer to its end: its record is cleared.
    pub fn worked(&self, label: &str) {
        self.map().remove(label);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rail_rests_longer_each_time_and_a_good_transfer_clears_it() {
        assert_eq!(cooldown(1), Duration::from_secs(1));
        assert_eq!(cooldown(3), Duration::from_secs(4));
        assert_eq!(cooldown(40), Duration::from_secs(60));
        let c = Cooldowns::new();
        let t0 = Instant::now();
        assert_eq!(c.resting("10.0.0.1", t0), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(1));
        assert!(c.resting("10.0.0.1", t0).is_some());
        assert_eq!(c.resting("10.0.0.1", t0 + Duration::from_secs(1)), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(2));
        assert_eq!(c.resting("10.0.0.2", t0), None, "per rail");
        c.worked("10.0.0.1");
        assert_eq!(c.resting("10.0.0.1", t0), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(1));
    }

    #[test]
    fn clones_share_their_records_and_separate_values_do_not() {
        let a = Cooldowns::new();
        let b = a.clone();
        let t0 = Instant::now();
        a.failed("rail", t0);
        assert!(b.resting("rail", t0).is_some());
        assert!(Cooldowns::new().resting("rail", t0).is_none());
    }
}
