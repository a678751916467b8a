//! The environment variables, read into one typed value when a comm is made (so one
//! process can hold comms made under different settings, as the tests do).

use crate::error::{NetError, Result};
use crate::wire::{EAGER_MAX, MAX_STREAMS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `NCCL_GRDMA_STREAMS`: data sockets per comm, 1..=16 (the listener's value is
    /// the one both ends use: it travels in the handle). None (unset): chosen from the
    /// listening device, as `host --streams auto` chooses (`props::streams_for`).
    pub streams: Option<usize>,
    /// `NCCL_GRDMA_CHECKS`: a CRC32C per piece, checked by the receiver, bad pieces
    /// sent again (on unless `0`). The sender's setting decides for its messages.
    pub checks: bool,
    /// `NCCL_GRDMA_TEST_INJECT_FAULTS=N`: flip one bit in about 1 of N pieces sent,
    /// after its CRC is taken, so the receiver's check fails and repair runs (tests);
    /// never a piece's last allowed attempt unless N is 1.
    pub inject_one_in: Option<u32>,
    /// `NCCL_GRDMA_EAGER_MAX`: the largest message sent before its receive is known
    /// (bytes, 0: none; at most `wire::EAGER_MAX`). Small messages gain (NCCL's
    /// default 128 KiB chunks: no wait on the other rank's GPU), large ones lose the
    /// receiver's bounce copy, so above this they wait for the clear-to-send.
    pub eager_max: u64,
    /// `NCCL_GRDMA_EAGER_BY_NUMBER` (the listener's, it travels in the handle): an eager
    /// message for a receive of one buffer is placed by the receiver at `irecv`, by its
    /// number, instead of waiting for the sender's match frame (one round trip less per
    /// small message). Off: under NCCL on H100s it gained at 16-64 KiB and lost above
    /// (docs/measurements/h100/2026-12-06-nccl-plugin, `j-` and `n-`).
    pub eager_by_number: bool,
}

/// `NCCL_GRDMA_EAGER_MAX` when unset: NCCL's default chunks go eagerly, tuned 2 MiB
/// chunks straight into the posted buffer (H200: 4.2 GB/s send/recv at the defaults
/// eager, against 0.93 waiting; tuned 11.3 waiting, against 4.0 eager).
pub const DEFAULT_EAGER_MAX: u64 = 1 << 20;

impl Config {
    pub fn from_env() -> Result<Self> {
        Self::parse(|k| std::env::var(k).ok())
    }

    /// The same from any lookup (the tests feed a map).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let streams = match get("NCCL_GRDMA_STREAMS") {
            None => None,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_STREAMS).contains(&n) => Some(n),
                _ => {
                    return Err(NetError::invalid(format!(
                        "NCCL_GRDMA_STREAMS={v:?}: expected a number of sockets from 1 to {MAX_STREAMS}"
                    )))
                }
            },
        };
        let checks = switch(
            &get,
            "NCCL_GRDMA_CHECKS",
            true,
            "1 (checks on, the default) or 0 (off)",
        )?;
        let inject_one_in = match get("NCCL_GRDMA_TEST_INJECT_FAULTS") {
            None => None,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => {
                    return Err(NetError::invalid(format!(
                        "NCCL_GRDMA_TEST_INJECT_FAULTS={v:?}: expected N, to corrupt 1 piece in N (0: none)"
                    )))
                }
            },
        };
        let eager_max = match get("NCCL_GRDMA_EAGER_MAX") {
            None => DEFAULT_EAGER_MAX,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n <= EAGER_MAX => n,
                _ => {
                    return Err(NetError::invalid(format!(
                        "NCCL_GRDMA_EAGER_MAX={v:?}: expected bytes from 0 (never eager) to {}",
                        EAGER_MAX
                    )))
                }
            },
        };
        let eager_by_number = switch(
            &get,
            "NCCL_GRDMA_EAGER_BY_NUMBER",
            false,
            "0 (match frames, the default) or 1",
        )?;
        Ok(Self {
            streams,
            checks,
            inject_one_in,
            eager_max,
            eager_by_number,
        })
    }
}

/// A 0/1 variable `name` (`default` when unset; `expected` says both values in the error).
fn switch(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
    expected: &str,
) -> Result<bool> {
    match get(name).as_deref().map(str::trim) {
        None => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(NetError::invalid(format!(
            "{name}={v:?}: expected {expected}"
        ))),
    }
}

/// `NCCL_GRDMA_TRANSPORT`: what carries the comms of every device (read once, when the
/// devices are found).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Verbs where the interface belongs to an RDMA device, TCP elsewhere (the default).
    Auto,
    Tcp,
    /// Verbs on every device; an interface without an RDMA device is an error.
    Verbs,
}

impl Transport {
    pub fn from_env() -> Result<Self> {
        Self::parse(std::env::var("NCCL_GRDMA_TRANSPORT").ok().as_deref())
    }

    pub fn parse(v: Option<&str>) -> Result<Self> {
        match v.map(str::trim) {
            None | Some("auto") => Ok(Transport::Auto),
            Some("tcp") => Ok(Transport::Tcp),
            Some("verbs") | Some("rdma") => Ok(Transport::Verbs),
            Some(v) => Err(NetError::invalid(format!(
                "NCCL_GRDMA_TRANSPORT={v:?}: expected auto (verbs where the interface has an RDMA device, else TCP), tcp or verbs"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config> {
        Config::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            c,
            Config {
                streams: None,
                checks: true,
                inject_one_in: None,
                eager_max: DEFAULT_EAGER_MAX,
                eager_by_number: false,
            }
        );
    }

    #[test]
    fn values_and_refusals() {
        let c = parse(&[
            ("NCCL_GRDMA_STREAMS", "8"),
            ("NCCL_GRDMA_CHECKS", "0"),
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "100"),
        ])
        .unwrap();
        assert_eq!(
            (c.streams, c.checks, c.inject_one_in),
            (Some(8), false, Some(100))
        );
        assert_eq!(
            parse(&[("NCCL_GRDMA_EAGER_MAX", "0")]).unwrap().eager_max,
            0
        );
        assert!(
            parse(&[("NCCL_GRDMA_EAGER_BY_NUMBER", "1")])
                .unwrap()
                .eager_by_number
        );
        for (k, v) in [
            ("NCCL_GRDMA_STREAMS", "0"),
            ("NCCL_GRDMA_STREAMS", "17"),
            ("NCCL_GRDMA_STREAMS", "four"),
            ("NCCL_GRDMA_CHECKS", "yes"),
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "-1"),
            ("NCCL_GRDMA_EAGER_MAX", "4194305"),
            ("NCCL_GRDMA_EAGER_MAX", "1MiB"),
            ("NCCL_GRDMA_EAGER_BY_NUMBER", "yes"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            assert!(e.msg.starts_with(k), "{e}");
        }
        assert_eq!(Transport::parse(None).unwrap(), Transport::Auto);
        assert_eq!(Transport::parse(Some("tcp")).unwrap(), Transport::Tcp);
        assert_eq!(Transport::parse(Some(" verbs")).unwrap(), Transport::Verbs);
        assert_eq!(Transport::parse(Some("rdma")).unwrap(), Transport::Verbs);
        let e = Transport::parse(Some("ib")).unwrap_err();
        assert!(e.msg.starts_with("NCCL_GRDMA_TRANSPORT=\"ib\""), "{e}");
        assert_eq!(
            parse(&[("NCCL_GRDMA_TEST_INJECT_FAULTS", "0")])
                .unwrap()
                .inject_one_in,
            None
        );
    }
}
