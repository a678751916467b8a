//! What a transfer reports, whatever carried it: the sender's [`SendReport`] (with the
//! receiver's [`ReceiverVerdict`]) and the receiver's [`RecvReport`] and
//! [`RecvOutcome`]s. The verbs and TCP transports build the same values, so the
//! commands print and serialise them the same way.

use super::gigabytes_per_second;
use super::plan::ChunkPlan;
use crate::memory::{DataPath, Verification};
use crate::memory_path::AttemptLog;
use crate::wire::{Ack, AckStatus, Payload, VerifyMode};

/// How a transfer's bytes were checked end to end, on either side (protocol version 2):
/// per-chunk CRC32C, the repairs, the whole transfer's digest, where it was stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Integrity {
    /// The checks applied (`--verify`); `None` where the transport does not say.
    pub verify: Option<VerifyMode>,
    pub payload: Option<Payload>,
    /// CRC32C of the whole (last) transfer: the sender's, or the receiver's as landed.
    pub digest: Option<u32>,
    /// Chunks whose CRC32C was checked (all transfers, all rounds).
    pub chunks_checked: u64,
    /// Chunks whose checksum failed and that were sent again until they passed.
    pub repaired: Vec<Repaired>,
    /// Chunks that still failed when the resends were used up.
    pub failed_chunks: Vec<u64>,
    /// The sender's `--name` for the transfer.
    pub name: Option<String>,
    /// Where the receiver wrote the data (`--output`; `-`: standard output).
    pub stored: Option<String>,
    /// Why the receiver could not write it.
    pub store_error: Option<String>,
    /// The sender's test-only `--test-inject-faults` (`1/N`), said wherever it was used.
    pub fault_injection: Option<String>,
}

/// A chunk that was sent `attempts` times in all before its checksum passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Repaired {
    pub chunk: u64,
    pub attempts: u32,
}

impl Integrity {
    /// Whether the checks asked for passed and the data was stored where asked.
    pub fn ok(&self, pattern_ok: bool) -> bool {
        let checks = match self.verify {
            // A transport that does not say: the pattern, as before version 2.
            None => pattern_ok,
            Some(m) => (!m.pattern() || pattern_ok) && self.failed_chunks.is_empty(),
        };
        checks && self.store_error.is_none()
    }
}

/// What the receiver said about the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReceiverVerdict {
    pub status: AckStatus,
    pub received_bytes: u64,
    pub verification: Option<Verification>,
}

impl ReceiverVerdict {
    pub fn ok(&self) -> bool {
        self.status == AckStatus::Verified
    }
}

/// The result of one transfer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SendReport {
    pub peer: String,
    /// The local RDMA device used ("rxe0").
    pub device: Option<String>,
    /// "send", "write" or "raw".
    pub op: &'static str,
    pub bytes: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    /// Chunks actually kept in flight (RDMA: work requests posted; TCP: chunks handed to
    /// the socket writers), the depth limited by the source.
    pub in_flight: u32,
    /// Address and route resolution, setup, registration and connection (on a kept
    /// connection: the next offer and its answer).
    pub connect_seconds: f64,
    /// It went on a connection that carried a transfer before: after the first of
    /// `--reuse-connection`, or an endpoint's kept TCP connection.
    pub kept_connection: bool,
    /// From the first work request posted to the last data completion.
    pub seconds: f64,
    /// `bytes / seconds`, in 10^9 bytes per second (GB/s; JSON `gb_per_s`, so that
    /// nobody reads it as gigabits).
    #[serde(rename = "gb_per_s")]
    pub gbps: f64,
    /// The receiver's verdict (framed transfers).
    pub receiver: Option<ReceiverVerdict>,
    /// Bytes of the reply a raw peer sent, if it sent one.
    pub raw_reply_bytes: Option<u32>,
    /// From the first work request posted to the receiver's ack: one round trip, data
    /// out and verdict back, including the receiver's verification (framed transfers).
    pub round_trip_seconds: Option<f64>,
    /// How long the receiver's verification took, as it reported (only receivers serving
    /// `--reuse-connection` report it).
    pub receiver_verify_seconds: Option<f64>,
    /// Where the data was when the NIC read it.
    pub path: DataPath,
    /// How the memory path was chosen on this connection: what was left out, refused
    /// and taken (the first connection's; later ones go straight to what worked).
    pub memory: AttemptLog,
    /// Checksums, repairs, digest (version 2 transports fill it in).
    pub integrity: Integrity,
    /// What each rail carried (striped TCP transfers; empty otherwise).
    pub rails: Vec<RailReport>,
}

impl SendReport {
    /// The receiver said the data verified.
    pub fn verified(&self) -> bool {
        self.receiver.is_some_and(|v| v.ok())
    }
}

/// One rail of a striped transfer: what it carried, and whether it failed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RailReport {
    /// Its place in the sender's list (`--bind-interfaces`, or the receiver's addresses).
    pub rail: usize,
    /// The local address its sockets start from (or the route's, unnamed).
    pub local: Option<String>,
    pub remote: String,
    /// Bytes and chunks this rail carried in this transfer: over TCP, written to its
    /// sockets; over verbs, chunks whose completion on this rail was the first (so the
    /// rails add up to the transfer, and a failed rail is not credited with the chunks
    /// it handed back).
    pub bytes: u64,
    pub chunks: u64,
    /// Of those chunks, second sendings: a failed rail's chunks in flight, chunks the
    /// receiver missed or found corrupt.
    pub resends: u64,
    /// Failures in this transfer (0 or 1: a failed rail carries nothing more).
    pub failures: u32,
    /// Why it failed, and when (seconds after the transfer's start).
    pub failed: Option<String>,
    pub failed_after_seconds: Option<f64>,
    /// Its chunks in flight when it failed, handed to the other rails.
    pub moved_chunks: u64,
    /// The stall its failure cost beyond the detection: from the failure until chunks
    /// were done in order again, plus the rounds of asking for the chunks it lost.
    pub stall_beyond_detection_seconds: Option<f64>,
    /// Why it carried nothing (resting after a failure, no connection).
    pub left_out: Option<String>,
}

impl RailReport {
    /// A rail before it carried anything: nothing sent, nothing failed; `left_out` says
    /// why it will carry nothing, if it will not.
    pub fn idle(
        rail: usize,
        local: Option<String>,
        remote: String,
        left_out: Option<String>,
    ) -> RailReport {
        RailReport {
            rail,
            local,
            remote,
            bytes: 0,
            chunks: 0,
            resends: 0,
            failures: 0,
            failed: None,
            failed_after_seconds: None,
            moved_chunks: 0,
            stall_beyond_detection_seconds: None,
            left_out,
        }
    }
}

/// What every framed transfer of one connection reports alike, whatever carried it (the
/// engine's sender over a verbs or a TCP link, `engine::send`).
pub(crate) struct Framed<'a> {
    pub peer: &'a str,
    pub device: Option<String>,
    pub op: &'static str,
    pub plan: &'a ChunkPlan,
    pub in_flight: u32,
    pub connect_seconds: f64,
    pub path: DataPath,
    /// How the memory path was chosen (reported with the first transfer only).
    pub memory: &'a AttemptLog,
}

impl Framed<'_> {
    /// The report of transfer `k` on the connection, from its times and the receiver's ack.
    pub fn report(&self, k: u32, seconds: f64, round_trip_seconds: f64, ack: &Ack) -> SendReport {
        let total = self.plan.total();
        SendReport {
            peer: self.peer.to_string(),
            device: self.device.clone(),
            op: self.op,
            bytes: total,
            chunks: self.plan.count(),
            chunk_bytes: self.plan.chunk_bytes(),
            in_flight: self.in_flight,
            connect_seconds: if k == 0 { self.connect_seconds } else { 0.0 },
            kept_connection: k > 0,
            seconds,
            gbps: gigabytes_per_second(total, seconds),
            receiver: Some(ReceiverVerdict {
                status: ack.status,
                received_bytes: ack.received_bytes,
                verification: ack.verification,
            }),
            raw_reply_bytes: None,
            round_trip_seconds: Some(round_trip_seconds),
            receiver_verify_seconds: ack.verify_micros.map(|us| us as f64 * 1e-6),
            path: self.path,
            memory: if k == 0 {
                self.memory.clone()
            } else {
                AttemptLog::default()
            },
            integrity: Integrity::default(),
            rails: Vec::new(),
        }
    }
}

/// One finished transfer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecvReport {
    pub peer: String,
    /// "send", "write" or "raw".
    pub op: &'static str,
    /// Bytes received.
    pub bytes: u64,
    pub chunks: u64,
    /// From the connection's establishment to the last data.
    pub seconds: f64,
    /// `bytes / seconds` in 10^9 bytes per second (JSON `gb_per_s`).
    #[serde(rename = "gb_per_s")]
    pub gbps: f64,
    pub path: DataPath,
    pub verification: Option<Verification>,
    /// Why the data could not be checked, if it could not.
    pub verify_error: Option<String>,
    pub first_values: Vec<i32>,
    /// The immediate data of a raw message.
    pub imm: Option<u32>,
    /// Whether the sender got our verdict (the ack, or the raw reply).
    pub reply_delivered: bool,
    /// Transfers done on this connection (more than 1 with the sender's
    /// `--reuse-connection`; `bytes`, `chunks`, `seconds` and `verification` then cover
    /// them all): received and verified, whether or not the ack reached the sender.
    pub transfers: u32,
    /// Transfers the sender offered on this connection: a connection broken after `k`
    /// of `n` reports `transfers` k of `offered` n, and is not ok.
    pub offered: u32,
    /// Time spent verifying (all transfers), after the data and before each ack.
    pub verify_seconds: f64,
    /// How this connection's buffer was chosen: methods left out, refused, taken.
    pub memory: AttemptLog,
    /// Checksums, repairs, digest, output (version 2 transports fill it in); boxed,
    /// as most outcomes carry none.
    pub integrity: Box<Integrity>,
    /// A striped TCP connection: what came over each rail.
    pub striped: Option<Box<StripedRecv>>,
}

/// What a receiver got over each rail of a striped connection (all its transfers).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StripedRecv {
    pub rails: Vec<RecvRail>,
    /// Chunks that did not arrive by the end of a pass (written into a rail that
    /// failed) and were asked for again.
    pub asked_again: u64,
}

/// One rail as the receiver saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecvRail {
    pub rail: u16,
    /// The sender's address on it.
    pub from: Option<String>,
    /// Chunks (and their bytes) that landed from its streams.
    pub bytes: u64,
    pub chunks: u64,
    /// Copies of chunks that had landed already, read and dropped.
    pub copies_dropped: u64,
    /// Why its streams stopped before the end (the sender gave it up, it broke).
    pub stopped: Option<String>,
}

impl RecvReport {
    /// Every offered transfer arrived whole, passed the checks asked for, and was
    /// stored where asked.
    pub fn ok(&self) -> bool {
        self.transfers == self.offered
            && self.integrity.ok(self.verification.is_some_and(|v| v.ok()))
    }
}

/// What happened, for the CLI to print (human lines or JSON).
#[derive(Debug, Clone)]
pub enum RecvOutcome {
    Listening {
        addr: String,
    },
    /// A connection request was refused (the peer was told why).
    Rejected {
        peer: String,
        reason: String,
    },
    Completed(Box<RecvReport>),
    /// A transfer broke off (the receiver goes on serving).
    Failed {
        peer: String,
        error: String,
    },
    /// Something about the receiver itself (out of descriptors, say), said once.
    Notice {
        text: String,
    },
}
