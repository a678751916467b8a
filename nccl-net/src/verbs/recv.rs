//! A verbs receive comm: `irecv` sends the clear-to-send of its buffers; each "written"
//! frame that comes names a buffer the sender wrote, whose CRC32C is checked where the
//! bytes landed and answered (intact, or write again). A receive small enough for NCCL's
//! LL and LL128 protocols is written into a staging buffer of the comm instead
//! ([`super::staging`]) and copied into NCCL's buffer once intact.

use super::frames::{Frame, Target};
use super::staging::Staging;
use super::{Comm, HasLink, Link};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::comm::{free_slot, RECV_MAGIC_VERBS};
use crate::error::{NetError, Result};
use crate::integrity;
use crate::log::{info, NET};
use std::collections::VecDeque;
use std::ffi::c_void;

struct Receiving {
    /// Each buffer: where it is, how much it holds, what landed (intact) so far.
    bufs: Vec<(u64, u64)>,
    got: Vec<Option<u64>>,
    /// Each buffer's staging buffer, where the peer writes it instead.
    staged: Vec<Option<usize>>,
}

pub struct State {
    link: Link,
    reqs: Vec<Option<Receiving>>,
    /// Frames (clear-to-sends and answers) waiting for a free send slot, in order: the
    /// sender matches clear-to-sends in the order they come, which must be NCCL's.
    outbox: VecDeque<Vec<u8>>,
    failed: Option<NetError>,
    /// Declared after `link`: its memory is freed only once the link's queue pair and
    /// registrations are gone.
    staging: Staging,
    /// This side's checks are on (`NCCL_GRDMA_CHECKS`): small receives are staged.
    checks: bool,
}

/// Where the peer writes each buffer of a receive, and the staging buffers it took.
struct Targets {
    targets: Vec<Target>,
    staged: Vec<Option<usize>>,
}

/// The most frames a well-behaved peer can leave waiting for a send slot here: 32
/// clear-to-sends and an answer for each of its 32 send requests.
const OUTBOX_MAX: usize = 2 * NCCL_NET_MAX_REQUESTS;

/// A verbs receive comm.
pub type VerbsRecv = Comm<State>;

impl HasLink for State {
    fn link(&mut self) -> &mut Link {
        &mut self.link
    }
}

impl VerbsRecv {
    pub fn new(link: Link, checks: bool) -> Box<Self> {
        info!(NET; "receive comm from {} over verbs", link.peer);
        Comm::boxed(
            RECV_MAGIC_VERBS,
            false,
            State {
                link,
                reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
                outbox: VecDeque::new(),
                failed: None,
                staging: Staging::default(),
                checks,
            },
        )
    }

    /// `irecv` of `bufs` (address, size, tag, registration): a request, or none when
    /// all 32 are in flight.
    pub fn irecv(&self, bufs: &[(*mut u8, u64, i32, usize)]) -> Result<Option<*mut c_void>> {
        let mut g = self.state();
        let s = &mut g.0;
        s.progress()?;
        let Some(slot) = free_slot(&s.reqs) else {
            return Ok(None);
        };
        // A small receive whose staging buffers are all held waits (busy, as when all 32
        // requests are in flight): it must not land unstaged.
        let Some(Targets { targets, staged }) = s.targets(bufs)? else {
            return Ok(None);
        };
        s.outbox.push_back(
            Frame::Cts {
                rreq: slot as u8,
                targets,
            }
            .encode(),
        );
        s.reqs[slot] = Some(Receiving {
            bufs: bufs.iter().map(|&(p, n, _, _)| (p as u64, n)).collect(),
            got: vec![None; bufs.len()],
            staged,
        });
        s.flush()?;
        Ok(Some(self.handles.ptr(slot)))
    }

    /// `test` of request `index`: the sizes that arrived once every buffer has intact
    /// bytes.
    pub fn test(&self, index: usize) -> Result<Option<Vec<u64>>> {
        let mut g = self.state();
        let s = &mut g.0;
        // A receive whose bytes all came before the connection failed is done.
        let progressed = s.progress();
        match &s.reqs[index] {
            None => Err(NetError::invalid(format!(
                "test: receive request {index} is not in flight"
            ))),
            Some(r) if r.got.iter().all(Option::is_some) => {
                let sizes: Vec<u64> = r.got.iter().map(|g| g.unwrap_or(0)).collect();
                s.staging.give_all(&r.staged);
                s.reqs[index] = None;
                s.link.count(&sizes);
                Ok(Some(sizes))
            }
            Some(_) => progressed.map(|()| None),
        }
    }

    pub fn close(&self) {
        self.state()
            .0
            .link
            .close("receive comm from", &integrity::RECEIVED);
    }
}

impl State {
    /// Where the peer writes each of `bufs`: NCCL's buffer (it must lie inside its
    /// registration), or a staging buffer of this comm for a small one, with the staging
    /// buffers taken (given back here if the receive cannot be posted); none when those
    /// are all held by receives in flight (the receive is to wait).
    fn targets(&mut self, bufs: &[(*mut u8, u64, i32, usize)]) -> Result<Option<Targets>> {
        let mut targets = Vec::with_capacity(bufs.len());
        let mut lens = Vec::with_capacity(bufs.len());
        for &(ptr, size, tag, reg) in bufs {
            let r = self.link.registration(reg)?;
            // An SGE of the buffer says it lies inside its registration (an empty one
            // needs none: nothing is written there).
            if size > 0 {
                r.sge(ptr as u64, size)?;
            }
            targets.push(Target {
                addr: ptr as u64,
                rkey: r.remote().0,
                tag,
                size,
            });
            let stage = size > 0 && integrity::must_stage(self.checks, size);
            lens.push(stage.then_some(size as usize));
        }
        let Some(staged) = self.staging.take_all(&mut self.link, &lens)? else {
            return Ok(None);
        };
        // A staged buffer is written into its staging buffer instead of NCCL's.
        for (target, stage) in targets.iter_mut().zip(&staged) {
            let Some(k) = *stage else { continue };
            match self.staging.remote(&self.link, k) {
                Ok((addr, rkey)) => (target.addr, target.rkey) = (addr, rkey),
                Err(e) => {
                    self.staging.give_all(&staged);
                    return Err(e);
                }
            }
        }
        Ok(Some(Targets { targets, staged }))
    }

    fn progress(&mut self) -> Result<()> {
        Link::latched(self, |s| &mut s.failed, Self::progress_inner)
    }

    fn progress_inner(&mut self) -> Result<()> {
        let (mut frames, mut sent) = (Vec::new(), Vec::new());
        // What came before a failure is acted on first (`Link::poll`).
        let polled = self.link.poll(&mut frames, &mut sent);
        drop(sent);
        for bytes in frames {
            let peer = &self.link.peer;
            let f = Frame::decode(&bytes).map_err(|e| {
                NetError::remote(format!("{peer} sent a bad control frame: {}", e.0))
            })?;
            let Frame::Written {
                sreq,
                rreq,
                entry,
                attempt,
                size,
                crc,
            } = f
            else {
                return Err(NetError::remote(format!(
                    "{peer} sent a receiver's frame to a receiver"
                )));
            };
            let Some(r) = self.reqs.get_mut(rreq as usize).and_then(Option::as_mut) else {
                return Err(NetError::remote(format!(
                    "{peer} wrote into receive {rreq}, which is not in flight"
                )));
            };
            let Some(&(addr, room)) = r.bufs.get(entry as usize) else {
                return Err(NetError::remote(format!(
                    "{peer} wrote into buffer {entry} of a receive of {} buffers",
                    r.bufs.len()
                )));
            };
            if size > room || r.got[entry as usize].is_some() {
                return Err(NetError::remote(format!(
                    "{peer} says it wrote {size} bytes into a buffer of {room}{}",
                    if r.got[entry as usize].is_some() {
                        " that already has its message"
                    } else {
                        ""
                    }
                )));
            }
            // Where the peer wrote: the staging buffer, or NCCL's.
            let staged = r.staged[entry as usize];
            let landed_at = staged.map_or(addr as *const u8, |k| self.staging.ptr(k) as *const u8);
            let intact = match crc {
                None => true,
                Some(c) => {
                    // SAFETY: NCCL's buffer, or the staging buffer taken for it (at least
                    // as long), writable and readable for `room` >= `size` bytes until
                    // this receive is reported done; the sender wrote it before this
                    // frame (RC delivers in order) and writes it again only after an
                    // answer that asks for it, so nothing writes it while it is read here.
                    let landed = unsafe { std::slice::from_raw_parts(landed_at, size as usize) };
                    integrity::crc32c(landed) == c
                }
            };
            if intact && staged.is_some() {
                // SAFETY: as above for the staging buffer; NCCL's buffer is ours for `room`
                // >= `size` bytes until the receive is reported done, which it is not yet.
                unsafe { std::ptr::copy_nonoverlapping(landed_at, addr as *mut u8, size as usize) };
            }
            if intact {
                r.got[entry as usize] = Some(size);
                if attempt > 0 {
                    self.link.counters.repaired += 1;
                }
            }
            if crc.is_some() {
                // A sender has at most one written frame of each of its 32 requests
                // unanswered, so the outbox holds at most those answers and the 32
                // clear-to-sends; more is a peer flooding frames, refused.
                if self.outbox.len() >= OUTBOX_MAX {
                    return Err(NetError::remote(format!(
                        "{peer} sent written frames faster than they can be answered ({OUTBOX_MAX} unanswered): not this plugin's protocol"
                    )));
                }
                self.outbox
                    .push_back(Frame::Answer { sreq, intact }.encode());
            }
        }
        polled?;
        self.flush()
    }

    /// Send what waits in the outbox, in order, while send slots are free.
    fn flush(&mut self) -> Result<()> {
        while let Some(f) = self.outbox.front() {
            if self.link.send_frame(f)?.is_none() {
                break;
            }
            self.outbox.pop_front();
        }
        Ok(())
    }
}
