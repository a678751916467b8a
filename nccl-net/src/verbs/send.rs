//! A verbs send comm: clear-to-sends come in, `isend` matches one and writes the
//! message into the receiver's buffer, then its "written" frame; the receiver's answer
//! completes the send or asks for the write again.

use super::frames::{Frame, Target};
use super::{rdma_err, Comm, HasLink, Link, MAX_RESENDS, WR_WRITE};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::comm::{free_slot, SEND_MAGIC_VERBS};
use crate::config::Config;
use crate::error::{NetError, Result};
use crate::integrity::{self, FaultInjector};
use crate::log::{info, NET};
use host::rdma::{SendOp, SendWr};
use std::collections::VecDeque;
use std::ffi::c_void;

/// A receive's buffers, as its clear-to-send said, each taken by one send.
struct Cts {
    rreq: u8,
    targets: Vec<(Target, bool)>,
}

struct Sending {
    data: u64,
    size: u64,
    reg: usize,
    rreq: u8,
    entry: u8,
    target: Target,
    crc: Option<u32>,
    attempt: u16,
    /// The frame that says it was written, not yet sent (no free send slot).
    frame_due: bool,
    /// The send slot of its last frame, until that frame's completion.
    frame_slot: Option<usize>,
    done: bool,
}

pub struct State {
    link: Link,
    ctss: VecDeque<Cts>,
    reqs: Vec<Option<Sending>>,
    cfg: Config,
    faults: Option<FaultInjector>,
    failed: Option<NetError>,
}

/// A verbs send comm.
pub type VerbsSend = Comm<State>;

impl HasLink for State {
    fn link(&mut self) -> &mut Link {
        &mut self.link
    }
}

impl VerbsSend {
    pub fn new(link: Link, cfg: Config) -> Box<Self> {
        let faults = cfg
            .inject_one_in
            .filter(|_| cfg.checks)
            .map(|n| FaultInjector::new(n, crate::comm::random_u64()));
        info!(NET; "send comm to {} over verbs: checks {}", link.peer, if cfg.checks { "on" } else { "off" });
        Comm::boxed(
            SEND_MAGIC_VERBS,
            true,
            State {
                link,
                ctss: VecDeque::new(),
                reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
                cfg,
                faults,
                failed: None,
            },
        )
    }

    /// `isend` of `size` bytes at `data` (inside registration `reg`): a request once a
    /// clear-to-send with a buffer of `tag` is here and a request slot is free, else none.
    pub fn isend(
        &self,
        data: *const u8,
        size: u64,
        tag: i32,
        reg: usize,
    ) -> Result<Option<*mut c_void>> {
        let mut g = self.state();
        let s = &mut g.0;
        s.progress()?;
        // The oldest clear-to-send with a free buffer of this tag.
        let Some((ci, ti)) = s.ctss.iter().enumerate().find_map(|(ci, c)| {
            c.targets
                .iter()
                .position(|(t, taken)| !taken && t.tag == tag)
                .map(|ti| (ci, ti))
        }) else {
            return Ok(None);
        };
        let Some(slot) = free_slot(&s.reqs) else {
            return Ok(None);
        };
        let target = s.ctss[ci].targets[ti].0;
        if size > target.size {
            return Err(NetError::usage(format!(
                "isend: a message of {size} bytes for a receive of {} bytes (tag {tag}, to {}): the ranks disagree on sizes",
                target.size, s.link.peer
            )));
        }
        let rreq = s.ctss[ci].rreq;
        s.ctss[ci].targets[ti].1 = true;
        if s.ctss[ci].targets.iter().all(|(_, taken)| *taken) {
            s.ctss.remove(ci);
        }
        let crc = s.cfg.checks.then(|| {
            // SAFETY: NCCL's contract: `data` is readable for `size` bytes until the
            // request is done, and nobody writes it meanwhile.
            integrity::crc32c(unsafe { std::slice::from_raw_parts(data, size as usize) })
        });
        s.reqs[slot] = Some(Sending {
            data: data as u64,
            size,
            reg,
            rreq,
            entry: ti as u8,
            target,
            crc,
            attempt: 0,
            frame_due: false,
            frame_slot: None,
            done: false,
        });
        s.write(slot)?;
        Ok(Some(self.handles.ptr(slot)))
    }

    /// `test` of request `index`: its size once done.
    pub fn test(&self, index: usize) -> Result<Option<u64>> {
        let mut g = self.state();
        let s = &mut g.0;
        s.progress()?;
        match &s.reqs[index] {
            None => Err(NetError::invalid(format!(
                "test: send request {index} is not in flight"
            ))),
            Some(r) if r.done => {
                let size = r.size;
                s.reqs[index] = None;
                s.link.count(&[size]);
                Ok(Some(size))
            }
            Some(_) => Ok(None),
        }
    }

    pub fn close(&self) {
        self.state().0.link.close("send comm to", &integrity::SENT);
    }
}

impl State {
    /// Take what came (frames, freed slots) and send the frames that waited for a slot.
    fn progress(&mut self) -> Result<()> {
        Link::latched(self, |s| &mut s.failed, Self::progress_inner)
    }

    fn progress_inner(&mut self) -> Result<()> {
        let (mut frames, mut sent) = (Vec::new(), Vec::new());
        self.link.poll(&mut frames, &mut sent)?;
        for slot in sent {
            let checks = self.cfg.checks;
            if let Some(r) = self
                .reqs
                .iter_mut()
                .flatten()
                .find(|r| r.frame_slot == Some(slot))
            {
                r.frame_slot = None;
                // Without checks no answer comes: the frame's completion says the peer
                // has it, and RC delivered the bytes written before it.
                if !checks && !r.frame_due {
                    r.done = true;
                }
            }
        }
        for bytes in frames {
            let f = Frame::decode(&bytes).map_err(|e| {
                NetError::remote(format!(
                    "{} sent a bad control frame: {}",
                    self.link.peer, e.0
                ))
            })?;
            match f {
                Frame::Cts { rreq, targets } => self.ctss.push_back(Cts {
                    rreq,
                    targets: targets.into_iter().map(|t| (t, false)).collect(),
                }),
                Frame::Answer { sreq, intact } => {
                    let peer = self.link.peer.clone();
                    let Some(r) = self.reqs.get_mut(sreq as usize).and_then(Option::as_mut) else {
                        return Err(NetError::remote(format!(
                            "{peer} answered send request {sreq}, which is not in flight"
                        )));
                    };
                    if intact {
                        if r.attempt > 0 {
                            self.link.counters.repaired += 1;
                        }
                        r.done = true;
                    } else if r.attempt >= MAX_RESENDS {
                        return Err(NetError::remote(format!(
                            "a message of {} bytes to {peer} failed its CRC32C at the receiver {} times; giving up",
                            r.size,
                            r.attempt + 1
                        )));
                    } else {
                        r.attempt += 1;
                        self.write(sreq as usize)?;
                    }
                }
                Frame::Written { .. } => {
                    return Err(NetError::remote(format!(
                        "{} sent a written frame to a sender",
                        self.link.peer
                    )))
                }
            }
        }
        for i in 0..self.reqs.len() {
            if self.reqs[i].as_ref().is_some_and(|r| r.frame_due) {
                self.send_written(i)?;
            }
        }
        Ok(())
    }

    /// Write request `i`'s bytes into its target (in writes of at most the port's
    /// largest message), then its frame.
    fn write(&mut self, i: usize) -> Result<()> {
        let Some(r) = self.reqs[i].as_ref() else {
            return Ok(());
        };
        let reg = self.link.registration(r.reg)?;
        let mut off = 0;
        while off < r.size {
            let len = (r.size - off).min(self.link.max_write);
            let sge = reg.sge(r.data + off, len)?;
            let wr = SendWr {
                wr_id: WR_WRITE | i as u64,
                sge,
                op: SendOp::Write {
                    remote_addr: r.target.addr + off,
                    rkey: r.target.rkey,
                },
                signaled: false,
                inline: false,
                solicited: false,
            };
            // SAFETY: the SGE names NCCL's buffer, which NCCL leaves alone until `test`
            // reports this request done; that comes after the receiver's answer or the
            // frame's completion, both of which follow the write's completion.
            unsafe { self.link.conn.qp.post_send(&wr) }.map_err(rdma_err)?;
            off += len;
        }
        self.send_written(i)
    }

    fn send_written(&mut self, i: usize) -> Result<()> {
        let Some(r) = self.reqs[i].as_mut() else {
            return Ok(());
        };
        let mut crc = r.crc;
        if let (Some(c), Some(f)) = (crc.as_mut(), self.faults.as_mut()) {
            if f.strike() {
                // The bytes went straight from NCCL's buffer, which is not ours to
                // corrupt: a CRC off by one bit fails the receiver's check the same way.
                *c ^= 1;
                self.link.counters.injected += 1;
            }
        }
        let frame = Frame::Written {
            sreq: i as u8,
            rreq: r.rreq,
            entry: r.entry,
            attempt: r.attempt,
            size: r.size,
            crc,
        };
        let slot = self.link.send_frame(&frame.encode())?;
        if let Some(r) = self.reqs[i].as_mut() {
            r.frame_due = slot.is_none();
            r.frame_slot = slot;
        }
        Ok(())
    }
}
