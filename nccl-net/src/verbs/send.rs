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

/// The receives' buffers the peer announced, in the order it posted them: a send takes
/// the oldest one of its tag not yet taken (the rule NCCL's InfiniBand transport keeps,
/// which keeps grouped receives and tags in order); a receive whose buffers are all
/// taken is forgotten.
#[derive(Default)]
struct Announced {
    ctss: VecDeque<Cts>,
}

impl Announced {
    /// Announce receive `rreq`'s buffers; false (nothing kept) when more receives than
    /// NCCL can have in flight would be waiting: a peer that floods clear-to-sends is
    /// not this plugin, and its frames must not grow this without bound.
    fn push(&mut self, rreq: u8, targets: Vec<Target>) -> bool {
        if self.ctss.len() >= NCCL_NET_MAX_REQUESTS {
            return false;
        }
        self.ctss.push_back(Cts {
            rreq,
            targets: targets.into_iter().map(|t| (t, false)).collect(),
        });
        true
    }

    /// The oldest buffer of `tag` not yet taken: its receive, its index there, where.
    fn oldest(&self, tag: i32) -> Option<(u8, u8, Target)> {
        self.ctss.iter().find_map(|c| {
            let i = c
                .targets
                .iter()
                .position(|(t, taken)| !taken && t.tag == tag)?;
            Some((c.rreq, i as u8, c.targets[i].0))
        })
    }

    /// Mark buffer `entry` of receive `rreq` taken.
    fn take(&mut self, rreq: u8, entry: u8) {
        if let Some(ci) = self.ctss.iter().position(|c| c.rreq == rreq) {
            if let Some(t) = self.ctss[ci].targets.get_mut(entry as usize) {
                t.1 = true;
            }
            if self.ctss[ci].targets.iter().all(|(_, taken)| *taken) {
                self.ctss.remove(ci);
            }
        }
    }
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
    announced: Announced,
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
                announced: Announced::default(),
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
        let Some((rreq, entry, target)) = s.announced.oldest(tag) else {
            return Ok(None);
        };
        let Some(slot) = free_slot(&s.reqs) else {
            return Ok(None);
        };
        if size > target.size {
            return Err(NetError::usage(format!(
                "isend: a message of {size} bytes for a receive of {} bytes (tag {tag}, to {}): the ranks disagree on sizes",
                target.size, s.link.peer
            )));
        }
        s.announced.take(rreq, entry);
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
            entry,
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
        // A send done before the connection failed is done (its ack came first).
        let progressed = s.progress();
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
            Some(_) => progressed.map(|()| None),
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
        // What came before a failure is acted on first (`Link::poll`).
        let polled = self.link.poll(&mut frames, &mut sent);
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
                Frame::Cts { rreq, targets } => {
                    if !self.announced.push(rreq, targets) {
                        return Err(NetError::remote(format!(
                            "{} announced more than {NCCL_NET_MAX_REQUESTS} receives at once (NCCL has at most that many in flight)",
                            self.link.peer
                        )));
                    }
                }
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
        polled?;
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
            if f.strike_attempt(r.attempt >= MAX_RESENDS) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tag: i32, size: u64) -> Target {
        Target {
            addr: 0x1000 * size,
            rkey: 7,
            tag,
            size,
        }
    }

    #[test]
    fn a_send_takes_the_oldest_announced_buffer_of_its_tag() {
        let mut a = Announced::default();
        assert_eq!(a.oldest(1), None, "nothing announced: the send waits");
        assert!(a.push(3, vec![t(1, 10), t(2, 20)]));
        assert!(a.push(4, vec![t(1, 30)]));
        // Tag 1: receive 3's first buffer, then receive 4's.
        assert_eq!(a.oldest(1), Some((3, 0, t(1, 10))));
        a.take(3, 0);
        assert_eq!(a.oldest(1), Some((4, 0, t(1, 30))));
        // Tag 2 is still receive 3's second buffer; once taken, receive 3 is gone.
        assert_eq!(a.oldest(2), Some((3, 1, t(2, 20))));
        a.take(3, 1);
        assert_eq!(a.ctss.len(), 1);
        assert_eq!(a.oldest(2), None, "no buffer of tag 2 left");
        a.take(4, 0);
        assert!(a.ctss.is_empty());
        // Taking what is not there changes nothing.
        a.take(9, 0);
        assert_eq!(a.oldest(1), None);
    }

    #[test]
    fn a_grouped_receive_is_matched_buffer_by_buffer_in_any_send_order() {
        let mut a = Announced::default();
        assert!(a.push(0, (10..18).map(|tag| t(tag, tag as u64)).collect()));
        for tag in [15, 10, 17, 12, 16, 11, 14, 13] {
            let (rreq, entry, target) = a.oldest(tag).expect("announced");
            assert_eq!((rreq, entry as i32, target.tag), (0, tag - 10, tag));
            a.take(rreq, entry);
        }
        assert!(
            a.ctss.is_empty(),
            "all eight taken: the receive is forgotten"
        );
    }

    #[test]
    fn a_flood_of_announcements_is_refused_not_kept() {
        let mut a = Announced::default();
        for r in 0..NCCL_NET_MAX_REQUESTS {
            assert!(a.push(r as u8, vec![t(1, 1)]), "receive {r} of 32 is kept");
        }
        assert!(
            !a.push(99, vec![t(1, 1)]),
            "a 33rd waiting receive is refused"
        );
        assert_eq!(a.ctss.len(), NCCL_NET_MAX_REQUESTS);
        // Taking one makes room again.
        let (rreq, entry, _) = a.oldest(1).unwrap();
        a.take(rreq, entry);
        assert!(a.push(32, vec![t(1, 1)]));
    }
}
