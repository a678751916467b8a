//! The errors of the RDMA layer. Every `Display` is one line a person can act on; errno
//! values are always shown with their meaning.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// No RDMA device at all (no hardware, no Soft-RoCE, or no kernel support).
    #[error("{NO_DEVICE}")]
    NoDevice,

    /// A verb or CM call failed. `context` says what it was called on ("192.0.2.9:7471").
    #[error("{}", verb_message(verb, context, *errno))]
    Verb {
        verb: &'static str,
        context: String,
        errno: i32,
    },

    /// `rdma_bind_addr` refused the address: rdma_cm answers EADDRNOTAVAIL (or
    /// EADDRINUSE) when another id already listens on the port.
    #[error(
        "cannot listen on {addr}: the port is in use (another `host recv` or rdma_cm server?) or the address is not on an RDMA device (errno {errno})"
    )]
    AddressUnavailable { addr: String, errno: i32 },

    /// A wait ran past its deadline.
    #[error("timed out after {} waiting for {waiting_for}", format_duration(*after))]
    Timeout {
        waiting_for: String,
        after: Duration,
    },

    /// The connection manager reported something else than the step expected.
    #[error("expected {expected}, got {got}{}", status_suffix(*status))]
    UnexpectedEvent {
        expected: &'static str,
        got: String,
        status: i32,
    },

    /// A work request completed with an error status.
    #[error(
        "{what} failed: {status_str} (work completion status {status}, opcode {opcode}, vendor error {vendor_err:#x})"
    )]
    Completion {
        what: String,
        status: u32,
        status_str: String,
        opcode: String,
        wr_id: u64,
        vendor_err: u32,
    },

    /// The provider lacks an operation.
    #[error("{what} is not supported by this RDMA device's driver")]
    Unsupported { what: &'static str },

    /// A caller passed something the verbs cannot take (private data too long, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The device reported, asynchronously, something that ends transfers on it.
    #[error("{0}")]
    DeviceFault(String),
}

/// What [`RdmaError::NoDevice`] says: where to look first (`host doctor` tells, from
/// this machine's facts, which step is missing), Soft-RoCE last.
pub const NO_DEVICE: &str = "no RDMA device found: look with `ibv_devices` or `rdma link`; the NIC's driver (e.g. mlx5_ib) and ib_uverbs, rdma_ucm must be loaded and /dev/infiniband present (`host doctor` checks each); without RDMA hardware use --transport tcp or Soft-RoCE (docs/hardware.md)";

impl RdmaError {
    pub fn verb(verb: &'static str, context: impl Into<String>, errno: i32) -> Self {
        RdmaError::Verb {
            verb,
            context: context.into(),
            errno,
        }
    }

    /// A verb failed and set `errno` (the librdmacm convention: return -1, set errno).
    /// `ENODEV` from the CM means there is no RDMA device to use.
    ///
    /// `errno` is read first, before `context` is called: anything that allocates or
    /// formats (the context's own `format!`) may change it.
    pub fn last<C: Into<String>>(verb: &'static str, context: impl FnOnce() -> C) -> Self {
        let errno = super::last_errno();
        Self::verb(verb, context(), errno)
    }

    /// The errno of a failed verb, if it is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RdmaError::Verb { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// "No route to host" for 113: the C library's message, without Rust's "(os error N)".
pub fn errno_message(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.strip_suffix(&format!(" (os error {errno})")) {
        Some(stripped) => stripped.to_string(),
        None => text,
    }
}

fn verb_message(verb: &str, context: &str, errno: i32) -> String {
    let call = if context.is_empty() {
        verb.to_string()
    } else {
        format!("{verb}({context})")
    };
    if errno == 0 {
        // Some verbs fail without setting errno.
        format!("{call}: failed (no errno set)")
    } else if errno == libc::ENOMEM && verb.starts_with("ibv_reg") {
        // Pinning memory beyond RLIMIT_MEMLOCK fails with a bare ENOMEM: say so.
        let hint = super::memlock::MemlockFacts::here()
            .map(|m| m.enomem_hint())
            .unwrap_or_else(|| {
                "registered memory counts against the locked-memory limit (RLIMIT_MEMLOCK, ulimit -l)".into()
            });
        format!("{call}: {} (errno {errno}); {hint}", errno_message(errno))
    } else {
        format!("{call}: {} (errno {errno})", errno_message(errno))
    }
}

/// CM event status: negative errno for most events, a positive reason code for REJECTED.
fn status_suffix(status: i32) -> String {
    match status {
        0 => String::new(),
        s if s < 0 => format!(" ({}, errno {})", errno_message(-s), -s),
        s => format!(" (status {s})"),
    }
}

pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 && (s - s.round()).abs() < 1e-9 {
        format!("{} s", s.round() as u64)
    } else {
        format!("{s:.3} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_read_before_the_context_is_formatted() {
        // A failed call leaves ENOENT; formatting the context fails another (ENOTDIR).
        // The error must name the first: it used to read errno after the context's
        // format!, whose allocations and calls may change it.
        assert!(std::fs::File::open("/nonexistent-for-this-test").is_err());
        let e = RdmaError::last("rdma_test", || {
            assert!(std::fs::File::open("/proc/self/status/not-a-directory").is_err());
            "the context".to_string()
        });
        assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
    }

    #[test]
    fn a_taken_port_says_so() {
        let e = RdmaError::AddressUnavailable {
            addr: "0.0.0.0:7471".into(),
            errno: libc::EADDRNOTAVAIL,
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cannot listen on 0.0.0.0:7471: the port is in use"),
            "{text}"
        );
    }

    #[test]
    fn verb_errors_name_the_call_the_target_and_the_errno_meaning() {
        let e = RdmaError::verb("rdma_resolve_addr", "192.0.2.9:7471", libc::EHOSTUNREACH);
        assert_eq!(
            e.to_string(),
            "rdma_resolve_addr(192.0.2.9:7471): No route to host (errno 113)"
        );
        let e = RdmaError::verb("ibv_alloc_pd", "", libc::ENOMEM);
        assert_eq!(
            e.to_string(),
            "ibv_alloc_pd: Cannot allocate memory (errno 12)"
        );
        assert_eq!(e.errno(), Some(12));
    }

    #[test]
    fn a_registration_enomem_names_the_locked_memory_limit() {
        let e = RdmaError::verb(
            "ibv_reg_mr",
            "1073741824 bytes of host memory",
            libc::ENOMEM,
        );
        let text = e.to_string();
        assert!(
            text.starts_with(
                "ibv_reg_mr(1073741824 bytes of host memory): Cannot allocate memory (errno 12); "
            ),
            "{text}"
        );
        assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
        let e = RdmaError::verb("ibv_reg_dmabuf_mr", "GPU memory", libc::ENOMEM);
        assert!(e.to_string().contains("RLIMIT_MEMLOCK"));
        // Other calls' ENOMEM is not about pinned memory.
        let e = RdmaError::verb("ibv_create_cq", "", libc::ENOMEM);
        assert!(!e.to_string().contains("RLIMIT_MEMLOCK"));
    }

    #[test]
    fn errno_zero_is_not_shown_as_success() {
        let e = RdmaError::verb("ibv_reg_mr", "16 KiB of host memory", 0);
        assert_eq!(
            e.to_string(),
            "ibv_reg_mr(16 KiB of host memory): failed (no errno set)"
        );
    }

    #[test]
    fn errno_message_strips_the_rust_suffix() {
        assert_eq!(errno_message(libc::ECONNREFUSED), "Connection refused");
        assert_eq!(errno_message(libc::ETIMEDOUT), "Connection timed out");
    }

    #[test]
    fn other_errors_are_one_line() {
        let t = RdmaError::Timeout {
            waiting_for: "RDMA_CM_EVENT_ESTABLISHED".into(),
            after: Duration::from_secs(10),
        };
        assert_eq!(
            t.to_string(),
            "timed out after 10 s waiting for RDMA_CM_EVENT_ESTABLISHED"
        );
        let u = RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ADDR_RESOLVED",
            got: "RDMA_CM_EVENT_ADDR_ERROR".into(),
            status: -libc::EHOSTUNREACH,
        };
        assert_eq!(
            u.to_string(),
            "expected RDMA_CM_EVENT_ADDR_RESOLVED, got RDMA_CM_EVENT_ADDR_ERROR (No route to host, errno 113)"
        );
        let c = RdmaError::Completion {
            what: "SEND of chunk 3".into(),
            status: 5,
            status_str: "Work Request Flushed Error".into(),
            opcode: "SEND".into(),
            wr_id: 3,
            vendor_err: 0x244,
        };
        assert_eq!(
            c.to_string(),
            "SEND of chunk 3 failed: Work Request Flushed Error (work completion status 5, opcode SEND, vendor error 0x244)"
        );
        let no_device = RdmaError::NoDevice.to_string();
        assert!(
            no_device.starts_with("no RDMA device found: look with `ibv_devices` or `rdma link`"),
            "{no_device}"
        );
        // How to look comes first; Soft-RoCE, for machines without hardware, last.
        assert!(no_device.find("mlx5_ib") < no_device.find("Soft-RoCE"));
        for e in [t, u, c, RdmaError::NoDevice] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_duration(Duration::from_secs(10)), "10 s");
        assert_eq!(format_duration(Duration::from_millis(500)), "0.500 s");
    }
}
