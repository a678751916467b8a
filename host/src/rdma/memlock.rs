//! The locked-memory limit (`RLIMIT_MEMLOCK`, `ulimit -l`): every byte the NIC registers
//! is pinned and counted against it, unless the process has `CAP_IPC_LOCK` (root does).
//! A registration over the limit fails with a bare ENOMEM ("Cannot allocate memory"),
//! so the errors of registrations and `host doctor` name it.
//!
//! Read from `/proc/self/limits` and `/proc/self/status` (no system call of our own);
//! the words are pure functions of what was read, tested below.

use crate::units::format_bytes;

/// The limit and the capability that lifts it, as this process has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemlockFacts {
    /// The soft limit in bytes; `None`: unlimited.
    pub limit_bytes: Option<u64>,
    /// `CAP_IPC_LOCK` in the effective set: the limit does not apply.
    pub cap_ipc_lock: bool,
}

impl MemlockFacts {
    /// This process's limit and capability, or `None` where /proc does not say.
    pub fn here() -> Option<MemlockFacts> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Some(MemlockFacts {
            limit_bytes: parse_limits(&limits)?,
            cap_ipc_lock: parse_cap_ipc_lock(&status),
        })
    }

    /// Whether `bytes` of registered memory fit under the limit.
    pub fn allows(&self, bytes: u64) -> bool {
        self.cap_ipc_lock || self.limit_bytes.is_none_or(|l| bytes <= l)
    }

    /// One line for `host doctor`: the limit and what it means for `bytes`.
    pub fn describe(&self, bytes: u64) -> String {
        let limit = self.limit_words();
        if self.cap_ipc_lock {
            return format!(
                "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): {limit}, but this process has CAP_IPC_LOCK, so registrations are not bound by it"
            );
        }
        match self.limit_bytes {
            None => format!("locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): {limit}"),
            Some(l) if bytes <= l => format!(
                "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): {limit}, enough to register {}",
                format_bytes(bytes)
            ),
            Some(_) => format!(
                "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): {limit}, too small to register {}: registrations beyond it fail with \"Cannot allocate memory\"; {}",
                format_bytes(bytes),
                RAISE
            ),
        }
    }

    /// What a failed registration's ENOMEM means here.
    pub fn enomem_hint(&self) -> String {
        let limit = self.limit_words();
        if self.cap_ipc_lock {
            format!("the locked-memory limit (RLIMIT_MEMLOCK) is {limit} but this process has CAP_IPC_LOCK, so it is not the cause: the NIC or the machine is short of memory")
        } else if self.limit_bytes.is_none() {
            "the locked-memory limit (RLIMIT_MEMLOCK) is unlimited, so it is not the cause: the NIC or the machine is short of memory".to_string()
        } else {
            format!("registered memory counts against the locked-memory limit (RLIMIT_MEMLOCK, ulimit -l), here {limit}; {RAISE}")
        }
    }

    fn limit_words(&self) -> String {
        match self.limit_bytes {
            None => "unlimited".to_string(),
            Some(b) => format_bytes(b),
        }
    }
}

/// How to raise the limit, for the places people run `host`.
const RAISE: &str = "raise it: `ulimit -l unlimited` in the shell, `* - memlock unlimited` in /etc/security/limits.conf, LimitMEMLOCK=infinity for a systemd service, `--ulimit memlock=-1` for docker";

/// The soft "Max locked memory" of a `/proc/PID/limits` text: `Some(None)` for
/// unlimited, `None` if the line is missing or malformed.
pub fn parse_limits(text: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(None)
    } else {
        soft.parse().ok().map(Some)
    }
}

/// Whether `CapEff` of a `/proc/PID/status` text has `CAP_IPC_LOCK` (bit 14).
pub fn parse_cap_ipc_lock(text: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    text.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str =
        "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max locked memory         8388608              8388608              bytes     \n\
Max address space         unlimited            unlimited            bytes     \n";

    #[test]
    fn the_soft_limit_is_read() {
        assert_eq!(parse_limits(LIMITS), Some(Some(8 << 20)));
        let unlimited = LIMITS.replace("8388608              8388608", "unlimited unlimited");
        assert_eq!(parse_limits(&unlimited), Some(None));
        assert_eq!(parse_limits("Max cpu time unlimited"), None);
        assert_eq!(parse_limits("Max locked memory   lots"), None);
    }

    #[test]
    fn cap_ipc_lock_is_bit_14_of_the_effective_set() {
        assert!(parse_cap_ipc_lock(
            "Name:\thost\nCapEff:\t000001ffffffffff\n"
        ));
        assert!(parse_cap_ipc_lock("CapEff:\t0000000000004000\n"));
        assert!(!parse_cap_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(!parse_cap_ipc_lock("CapEff:\t0000000000003fff\n"));
        assert!(!parse_cap_ipc_lock("no such line"));
    }

    #[test]
    fn the_words_say_whether_the_limit_binds() {
        let user = MemlockFacts {
            limit_bytes: Some(8 << 20),
            cap_ipc_lock: false,
        };
        assert!(user.allows(8 << 20));
        assert!(!user.allows(1 << 30));
        assert_eq!(
            user.describe(16 << 10),
            "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): 8 MiB, enough to register 16 KiB"
        );
        let too_small = user.describe(1 << 30);
        assert!(
            too_small.starts_with("locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): 8 MiB, too small to register 1 GiB: registrations beyond it fail with \"Cannot allocate memory\"; raise it: `ulimit -l unlimited`"),
            "{too_small}"
        );
        assert!(user.enomem_hint().contains("here 8 MiB; raise it"));
        let root = MemlockFacts {
            cap_ipc_lock: true,
            ..user
        };
        assert!(root.allows(1 << 40));
        assert!(root.describe(1 << 30).contains("CAP_IPC_LOCK"));
        assert!(root.enomem_hint().contains("not the cause"));
        let unlimited = MemlockFacts {
            limit_bytes: None,
            cap_ipc_lock: false,
        };
        assert!(unlimited.allows(u64::MAX));
        assert_eq!(
            unlimited.describe(1),
            "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l): unlimited"
        );
        assert!(unlimited
            .enomem_hint()
            .contains("unlimited, so it is not the cause"));
    }

    #[test]
    fn this_process_can_be_read() {
        // Linux always has both files; the parse must succeed on the real thing.
        let facts = MemlockFacts::here().expect("/proc/self/limits has Max locked memory");
        let _ = facts.describe(1 << 20);
    }
}
