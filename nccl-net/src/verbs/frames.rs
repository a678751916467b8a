//! The control frames of a verbs comm, one per SEND into the peer's receive slots:
//! the receiver's clear-to-send (where NCCL's buffers are: address, key, size, tag),
//! the sender's "written" (which buffer, how many bytes, their CRC32C), and the
//! receiver's answer (intact, or write it again). The data itself never passes through
//! a frame: it is an RDMA WRITE straight into NCCL's buffer.

use crate::wire::{WireError, MAX_RECVS};

/// Bytes of one receive slot: the largest frame (a clear-to-send of 8 buffers) fits.
pub const SLOT: usize = 256;

const CTS: u8 = 1;
const WRITTEN: u8 = 2;
const ANSWER: u8 = 3;

/// One buffer of a receive, as the sender needs it to write there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub addr: u64,
    pub rkey: u32,
    pub tag: i32,
    pub size: u64,
}

/// A control frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Receive request `rreq` posted these buffers (1..=8), in NCCL's order.
    Cts { rreq: u8, targets: Vec<Target> },
    /// Send request `sreq` wrote `size` bytes into buffer `entry` of receive `rreq`;
    /// `crc`: their CRC32C (none: checks off, nothing to answer). `attempt` counts the
    /// writes of this message (0 the first).
    Written {
        sreq: u8,
        rreq: u8,
        entry: u8,
        attempt: u16,
        size: u64,
        crc: Option<u32>,
    },
    /// The receiver's word on `sreq`'s write: intact, or write it again.
    Answer { sreq: u8, intact: bool },
}

fn err<T>(m: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(m.into()))
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SLOT);
        match self {
            Frame::Cts { rreq, targets } => {
                b.extend_from_slice(&[CTS, *rreq, targets.len() as u8, 0]);
                for t in targets {
                    b.extend_from_slice(&t.addr.to_le_bytes());
                    b.extend_from_slice(&t.rkey.to_le_bytes());
                    b.extend_from_slice(&t.tag.to_le_bytes());
                    b.extend_from_slice(&t.size.to_le_bytes());
                }
            }
            Frame::Written {
                sreq,
                rreq,
                entry,
                attempt,
                size,
                crc,
            } => {
                b.extend_from_slice(&[WRITTEN, *sreq, *rreq, *entry]);
                b.extend_from_slice(&attempt.to_le_bytes());
                b.extend_from_slice(&[u8::from(crc.is_some()), 0]);
                b.extend_from_slice(&size.to_le_bytes());
                b.extend_from_slice(&crc.unwrap_or(0).to_le_bytes());
            }
            Frame::Answer { sreq, intact } => {
                b.extend_from_slice(&[ANSWER, *sreq, u8::from(*intact), 0]);
            }
        }
        b
    }

    /// A frame from the bytes a receive slot got; anything malformed is an error (the
    /// peer is not this plugin, or broke the protocol), never a panic.
    pub fn decode(b: &[u8]) -> Result<Frame, WireError> {
        let Some(&kind) = b.first() else {
            return err("an empty control frame");
        };
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
        match kind {
            CTS => {
                if b.len() < 4 {
                    return err("a clear-to-send frame is short");
                }
                let n = b[2] as usize;
                if n == 0 || n > MAX_RECVS || b.len() < 4 + n * 24 {
                    return err(format!(
                        "a clear-to-send frame of {n} buffers in {} bytes (1 to {MAX_RECVS})",
                        b.len()
                    ));
                }
                let targets = (0..n)
                    .map(|i| {
                        let at = 4 + i * 24;
                        Target {
                            addr: u64_at(at),
                            rkey: u32_at(at + 8),
                            tag: u32_at(at + 12) as i32,
                            size: u64_at(at + 16),
                        }
                    })
                    .collect();
                Ok(Frame::Cts {
                    rreq: b[1],
                    targets,
                })
            }
            WRITTEN => {
                if b.len() < 20 {
                    return err("a written frame is short");
                }
                Ok(Frame::Written {
                    sreq: b[1],
                    rreq: b[2],
                    entry: b[3],
                    attempt: u16::from_le_bytes([b[4], b[5]]),
                    size: u64_at(8),
                    crc: (b[6] == 1).then(|| u32_at(16)),
                })
            }
            ANSWER => {
                if b.len() < 4 {
                    return err("an answer frame is short");
                }
                Ok(Frame::Answer {
                    sreq: b[1],
                    intact: b[2] == 1,
                })
            }
            k => err(format!("a control frame of unknown kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_fit_a_slot() {
        let t = |i: u64| Target {
            addr: 0x7f00_0000_0000 + i,
            rkey: 0xdead_0000 + i as u32,
            tag: -(i as i32),
            size: 1 << (i + 10),
        };
        let frames = [
            Frame::Cts {
                rreq: 31,
                targets: (0..MAX_RECVS as u64).map(t).collect(),
            },
            Frame::Cts {
                rreq: 0,
                targets: vec![t(1)],
            },
            Frame::Written {
                sreq: 5,
                rreq: 7,
                entry: 3,
                attempt: 2,
                size: (1 << 30) + 3,
                crc: Some(0xe306_9283),
            },
            Frame::Written {
                sreq: 0,
                rreq: 0,
                entry: 0,
                attempt: 0,
                size: 0,
                crc: None,
            },
            Frame::Answer {
                sreq: 9,
                intact: false,
            },
            Frame::Answer {
                sreq: 31,
                intact: true,
            },
        ];
        for f in frames {
            let b = f.encode();
            assert!(b.len() <= SLOT, "{f:?} takes {} bytes", b.len());
            assert_eq!(Frame::decode(&b).unwrap(), f);
        }
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert!(Frame::decode(&[]).is_err());
        assert!(Frame::decode(&[9, 0, 0, 0])
            .unwrap_err()
            .0
            .contains("unknown kind 9"));
        assert!(Frame::decode(&[CTS, 0, 0, 0]).is_err(), "no buffers");
        assert!(
            Frame::decode(&[CTS, 0, 9, 0]).is_err(),
            "more than maxRecvs"
        );
        assert!(Frame::decode(&[CTS, 0, 2, 0, 1, 2]).is_err(), "short");
        assert!(Frame::decode(&[WRITTEN, 1, 2, 3]).is_err());
        assert!(Frame::decode(&[ANSWER]).is_err());
        // Noise of every length never panics.
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in 0..SLOT {
            let v: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = Frame::decode(&v);
        }
    }
}
