//! Going down a [`Plan`] at run time: try each method until one works, and keep a log
//! of what was left out, what was refused and why, and what was taken.
//!
//! The walk knows nothing about GPUs or NICs: the caller's closure does the real work
//! (allocate, export, register) and answers `Err("what was refused, errno in words")`.
//! So the order and the reporting are tested here with closures that refuse on cue.

use super::plan::{Method, Plan};
use serde::Serialize;
use std::fmt;

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Attempt {
    /// Not tried: the plan left it out.
    Skipped { method: Method, why: String },
    /// Tried and refused at run time.
    Refused { method: Method, why: String },
    /// Tried, and it worked.
    Taken { method: Method },
}

/// What happened, in order: the methods left out first, then each attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AttemptLog {
    pub attempts: Vec<Attempt>,
}

impl AttemptLog {
    /// The log of a plan before anything is tried: what it left out, and why.
    pub fn left_out(plan: &Plan) -> AttemptLog {
        AttemptLog {
            attempts: plan
                .left_out
                .iter()
                .map(|l| Attempt::Skipped {
                    method: l.method,
                    why: l.why.clone(),
                })
                .collect(),
        }
    }

    /// The method that worked, if one did.
    pub fn taken(&self) -> Option<Method> {
        self.attempts.iter().find_map(|a| match a {
            Attempt::Taken { method } => Some(*method),
            _ => None,
        })
    }

    /// The log for people: the left-out methods (one line per distinct reason), one
    /// line per refusal, and the path taken.
    pub fn lines(&self) -> Vec<String> {
        let mut skipped: Vec<(Vec<&str>, &str)> = Vec::new();
        for a in &self.attempts {
            if let Attempt::Skipped { method, why } = a {
                match skipped.iter_mut().find(|(_, w)| *w == why.as_str()) {
                    Some((names, _)) => names.push(method.name()),
                    None => skipped.push((vec![method.name()], why)),
                }
            }
        }
        let mut lines: Vec<String> = skipped
            .into_iter()
            .map(|(names, why)| format!("{} not tried: {why}", names.join(", ")))
            .collect();
        for a in &self.attempts {
            match a {
                Attempt::Skipped { .. } => {}
                Attempt::Refused { method, why } => {
                    lines.push(format!("{} refused: {why}", method.name()))
                }
                Attempt::Taken { method } => lines.push(format!(
                    "memory path: {} ({})",
                    method.name(),
                    method.describe()
                )),
            }
        }
        lines
    }
}

/// A method worked: its value, which method, and the log.
#[derive(Debug)]
pub struct Walked<T> {
    pub value: T,
    pub method: Method,
    pub log: AttemptLog,
}

/// No method worked; Display names each and why, on one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NothingWorked {
    pub log: AttemptLog,
}

impl fmt::Display for NothingWorked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .log
            .attempts
            .iter()
            .filter_map(|a| match a {
                Attempt::Refused { method, why } => {
                    Some(format!("{} refused: {why}", method.name()))
                }
                Attempt::Skipped { method, why } => {
                    Some(format!("{} not tried: {why}", method.name()))
                }
                Attempt::Taken { .. } => None,
            })
            .collect();
        write!(f, "no memory path worked: {}", parts.join("; "))
    }
}

impl std::error::Error for NothingWorked {}

/// Try the plan's methods in order with `try_method` until one returns `Ok`.
pub fn walk<T>(
    plan: &Plan,
    mut try_method: impl FnMut(Method) -> Result<T, String>,
) -> Result<Walked<T>, NothingWorked> {
    let mut log = AttemptLog::left_out(plan);
    for &method in &plan.attempts {
        match try_method(method) {
            Ok(value) => {
                log.attempts.push(Attempt::Taken { method });
                return Ok(Walked { value, method, log });
            }
            Err(why) => log.attempts.push(Attempt::Refused { method, why }),
        }
    }
    Err(NothingWorked { log })
}

#[cfg(test)]
mod tests {
    use super::super::plan::{plan, Direction, NicFacts, PathFacts};
    use super::super::{GpuCapabilities, MemKind};
    use super::*;
    use crate::rdma::{DmaBufProbe, PeerMemModule};
    use crate::topology::PciDistance;

    /// An H200-like GPU and a NIC that says it has dma-buf, peermem loaded, one switch
    /// apart: every method is in the plan.
    fn everything() -> PathFacts {
        PathFacts {
            gpu: Ok(GpuCapabilities {
                dma_buf: true,
                gpudirect_rdma: true,
                peermem_loaded: true,
                can_map_host_memory: true,
            }),
            nic: NicFacts {
                name: "mlx5_0".into(),
                dma_buf: DmaBufProbe::Supported {
                    errno: Some(libc::EBADF),
                },
                peermem: Some(PeerMemModule::NvidiaPeermem),
            },
            distance: Ok(PciDistance::Pix),
            gpudirect_level: PciDistance::Pxb,
            bar1: None,
        }
    }

    const DMABUF_REFUSED: &str =
        "ibv_reg_dmabuf_mr(1 GiB of GPU memory, dma-buf fd 7): Operation not supported (errno 95)";

    #[test]
    fn the_first_method_that_works_is_taken() {
        let p = plan(Direction::Send, MemKind::Auto, &everything()).unwrap();
        let mut tried = Vec::new();
        let w = walk(&p, |m| {
            tried.push(m);
            Ok::<_, String>(m.name().len())
        })
        .unwrap();
        assert_eq!(tried, [Method::DmaBuf]);
        assert_eq!((w.method, w.value), (Method::DmaBuf, 7));
        assert_eq!(w.log.taken(), Some(Method::DmaBuf));
        assert_eq!(
            w.log.lines(),
            ["memory path: dma-buf (GPUDirect RDMA, GPU memory registered as a dma-buf)"]
        );
    }

    #[test]
    fn a_registration_refused_at_run_time_falls_back_and_says_why() {
        let p = plan(Direction::Send, MemKind::Auto, &everything()).unwrap();
        let w = walk(&p, |m| match m {
            Method::DmaBuf => Err(DMABUF_REFUSED.to_string()),
            Method::PeerMem => Err(
                "ibv_reg_mr(1 GiB of GPU memory at 0x7f0000000000): Bad address (errno 14)".into(),
            ),
            other => Ok(other),
        })
        .unwrap();
        assert_eq!(w.value, Method::Staged);
        assert_eq!(
            w.log.lines(),
            [
                format!("dma-buf refused: {DMABUF_REFUSED}"),
                "peermem refused: ibv_reg_mr(1 GiB of GPU memory at 0x7f0000000000): Bad address (errno 14)".to_string(),
                "memory path: staged (GPU memory staged through registered host memory)".to_string(),
            ]
        );
        assert_eq!(
            serde_json::to_value(&w.log).unwrap(),
            serde_json::json!({"attempts": [
                {"outcome": "refused", "method": "dma-buf", "why": DMABUF_REFUSED},
                {"outcome": "refused", "method": "peermem", "why": "ibv_reg_mr(1 GiB of GPU memory at 0x7f0000000000): Bad address (errno 14)"},
                {"outcome": "taken", "method": "staged"},
            ]})
        );
    }

    #[test]
    fn left_out_methods_come_first_grouped_by_reason() {
        let mut f = everything();
        f.gpu = Err("no GPU (cuInit: no CUDA-capable device is detected)".into());
        let p = plan(Direction::Send, MemKind::Auto, &f).unwrap();
        let w = walk(&p, Ok::<_, String>).unwrap();
        assert_eq!(w.method, Method::Host);
        assert_eq!(
            w.log.lines(),
            [
                "dma-buf, peermem, staged, mapped not tried: no GPU (cuInit: no CUDA-capable device is detected)",
                "memory path: host (host memory)",
            ]
        );
        assert_eq!(
            serde_json::to_value(&w.log).unwrap()["attempts"][0],
            serde_json::json!({
                "outcome": "skipped",
                "method": "dma-buf",
                "why": "no GPU (cuInit: no CUDA-capable device is detected)"
            })
        );
    }

    #[test]
    fn when_nothing_works_the_error_names_every_method() {
        let mut f = everything();
        f.nic.peermem = None;
        let p = plan(Direction::Recv, MemKind::Device, &f).unwrap();
        let e = walk(&p, |_| Err::<(), _>(DMABUF_REFUSED.to_string())).unwrap_err();
        assert_eq!(e.log.taken(), None);
        assert_eq!(
            e.to_string(),
            format!(
                "no memory path worked: peermem not tried: neither nvidia_peermem nor nv_peer_mem is loaded; dma-buf refused: {DMABUF_REFUSED}"
            )
        );
        assert!(!e.to_string().contains('\n'));
        assert_eq!(
            e.log.lines(),
            [
                "peermem not tried: neither nvidia_peermem nor nv_peer_mem is loaded".to_string(),
                format!("dma-buf refused: {DMABUF_REFUSED}"),
            ]
        );
    }

    #[test]
    fn the_receivers_last_resort_is_host_memory() {
        let p = plan(Direction::Recv, MemKind::Auto, &everything()).unwrap();
        assert_eq!(p.attempts, [Method::DmaBuf, Method::PeerMem, Method::Host]);
        let w = walk(&p, |m| {
            if m.is_gpudirect() {
                Err(format!("{} refused", m.name()))
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(w.method, Method::Host);
        assert_eq!(w.log.attempts.len(), 3);
        assert_eq!(
            w.log.lines().last().unwrap(),
            "memory path: host (host memory)"
        );
    }
}
