//! The receiver's verdict after the data: the [`Ack`] and its [`AckStatus`].

use super::constants::{ACK_MAGIC, VERSION};
use super::error::{open, WireError};
use crate::memory::Verification;

pub const ACK_LEN: usize = 56;

/// The receiver's verdict on the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckStatus {
    /// Every element matches the pattern.
    Verified,
    /// Some elements differ.
    Mismatch,
    /// The receiver could not check (its verification itself failed).
    VerifyFailed,
    /// The receiver ended the transfer before all data came: the sender stayed below its
    /// `--min-rate` (`received_bytes` says how far it got). Sent instead of a verdict.
    TooSlow,
    /// Chunks still failed their checksums after the allowed resends (the final
    /// [`Resend`](super::Resend) before this ack named them).
    ChecksumFailed,
    /// The data verified but the receiver could not store it (`--output`: a full disk,
    /// say); its log says why.
    NotStored,
}

/// The final message, receiver to sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub status: AckStatus,
    pub received_bytes: u64,
    /// Present unless `status` is `VerifyFailed`.
    pub verification: Option<Verification>,
    /// How long the receiver's verification took, in microseconds (saturating): sent
    /// only to senders that set a header flag (see the module documentation).
    pub verify_micros: Option<u32>,
    /// CRC32C of the whole transfer as it landed (with `--verify checksum|both`).
    pub digest: Option<u32>,
    /// Chunks that failed their checksum and were sent again until they passed.
    pub repaired: u32,
}

const ACK_HAS_VERIFICATION: u8 = 1;
const ACK_HAS_FIRST_MISMATCH: u8 = 2;
const ACK_HAS_CRC: u8 = 4;
const ACK_HAS_VERIFY_TIME: u8 = 8;
const ACK_HAS_DIGEST: u8 = 16;

impl Ack {
    /// The ack for a verification result (or for a failed verification).
    pub fn new(received_bytes: u64, verification: Option<Verification>) -> Ack {
        let status = match &verification {
            Some(v) if v.ok() => AckStatus::Verified,
            Some(_) => AckStatus::Mismatch,
            None => AckStatus::VerifyFailed,
        };
        Ack {
            status,
            received_bytes,
            verification,
            verify_micros: None,
            digest: None,
            repaired: 0,
        }
    }

    /// The ack of a transfer checked by its chunks' checksums (`digest` of the whole),
    /// and by the pattern too when `pattern` is given (`Some(None)`: that check itself
    /// failed).
    pub fn checked(
        received_bytes: u64,
        pattern: Option<Option<Verification>>,
        digest: Option<u32>,
        repaired: u32,
    ) -> Ack {
        let mut ack = match pattern {
            Some(verification) => Ack::new(received_bytes, verification),
            None => Ack::new(received_bytes, None).with_status(AckStatus::Verified),
        };
        ack.digest = digest;
        ack.repaired = repaired;
        ack
    }

    /// The same ack with another status (the receiver's last word: chunks that could not
    /// be repaired, data that could not be stored).
    pub fn with_status(self, status: AckStatus) -> Ack {
        Ack { status, ..self }
    }

    /// The receiver's word that the sender was too slow, after `received_bytes`.
    pub fn too_slow(received_bytes: u64) -> Ack {
        Ack {
            status: AckStatus::TooSlow,
            received_bytes,
            verification: None,
            verify_micros: None,
            digest: None,
            repaired: 0,
        }
    }

    /// The same ack, telling how long the verification took.
    pub fn with_verify_time(self, took: std::time::Duration) -> Ack {
        Ack {
            verify_micros: Some(took.as_micros().min(u32::MAX as u128) as u32),
            ..self
        }
    }

    pub fn encode(&self) -> [u8; ACK_LEN] {
        let mut out = [0u8; ACK_LEN];
        out[0..4].copy_from_slice(&ACK_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = match self.status {
            AckStatus::Verified => 0,
            AckStatus::Mismatch => 1,
            AckStatus::VerifyFailed => 2,
            AckStatus::TooSlow => 3,
            AckStatus::ChecksumFailed => 4,
            AckStatus::NotStored => 5,
        };
        let mut flags = 0u8;
        let v = self.verification;
        if let Some(v) = v {
            flags |= ACK_HAS_VERIFICATION;
            if v.first_mismatch.is_some() {
                flags |= ACK_HAS_FIRST_MISMATCH;
            }
            if v.crc32.is_some() {
                flags |= ACK_HAS_CRC;
            }
        }
        if self.verify_micros.is_some() {
            flags |= ACK_HAS_VERIFY_TIME;
        }
        if self.digest.is_some() {
            flags |= ACK_HAS_DIGEST;
        }
        out[7] = flags;
        out[8..16].copy_from_slice(&self.received_bytes.to_le_bytes());
        if let Some(v) = v {
            out[16..24].copy_from_slice(&v.elements.to_le_bytes());
            out[24..32].copy_from_slice(&v.mismatches.to_le_bytes());
            out[32..40].copy_from_slice(&v.first_mismatch.unwrap_or(0).to_le_bytes());
            out[40..44].copy_from_slice(&v.crc32.unwrap_or(0).to_le_bytes());
        }
        if let Some(us) = self.verify_micros {
            out[44..48].copy_from_slice(&us.to_le_bytes());
        }
        out[48..52].copy_from_slice(&self.digest.unwrap_or(0).to_le_bytes());
        out[52..56].copy_from_slice(&self.repaired.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Ack, WireError> {
        let mut r = open(buf, ACK_MAGIC, ACK_LEN)?;
        let code = r.u8();
        let status = match code {
            0 => AckStatus::Verified,
            1 => AckStatus::Mismatch,
            2 => AckStatus::VerifyFailed,
            3 => AckStatus::TooSlow,
            4 => AckStatus::ChecksumFailed,
            5 => AckStatus::NotStored,
            _ => return Err(WireError::UnknownStatus { code }),
        };
        let flags = r.u8();
        let known = ACK_HAS_VERIFICATION
            | ACK_HAS_FIRST_MISMATCH
            | ACK_HAS_CRC
            | ACK_HAS_VERIFY_TIME
            | ACK_HAS_DIGEST;
        if flags & !known != 0 {
            return Err(WireError::UnknownFlags { flags });
        }
        let received_bytes = r.u64();
        let elements = r.u64();
        let mismatches = r.u64();
        let first = r.u64();
        let crc = r.u32();
        let verify_micros = r.u32();
        let digest = r.u32();
        let repaired = r.u32();
        let verification = (flags & ACK_HAS_VERIFICATION != 0).then_some(Verification {
            elements,
            mismatches,
            first_mismatch: (flags & ACK_HAS_FIRST_MISMATCH != 0).then_some(first),
            crc32: (flags & ACK_HAS_CRC != 0).then_some(crc),
        });
        let consistent = match (status, &verification) {
            (AckStatus::Verified, Some(v)) => v.mismatches == 0 && v.first_mismatch.is_none(),
            // Checked by checksums alone (or not at all, `--verify off`).
            (AckStatus::Verified, None) => true,
            (AckStatus::Mismatch, Some(v)) => v.mismatches > 0,
            (AckStatus::VerifyFailed | AckStatus::TooSlow, None) => true,
            (AckStatus::ChecksumFailed | AckStatus::NotStored, _) => true,
            _ => false,
        };
        if !consistent {
            return Err(WireError::Inconsistent {
                what: "the ack's status disagrees with its counts",
            });
        }
        Ok(Ack {
            status,
            received_bytes,
            verification,
            verify_micros: (flags & ACK_HAS_VERIFY_TIME != 0).then_some(verify_micros),
            digest: (flags & ACK_HAS_DIGEST != 0).then_some(digest),
            repaired,
        })
    }
}

impl Ack {
    /// Whether this ack speaks of the transfer that was sent (`total` bytes, whole `i32`
    /// elements): a receiver that claims another byte or element count is not believed.
    pub fn check_counts(&self, total: u64) -> Result<(), String> {
        if self.status == AckStatus::TooSlow {
            return Ok(()); // it says how far it got, by definition less than all
        }
        if self.received_bytes != total {
            return Err(format!(
                "the receiver's ack speaks of {} bytes, but {total} were sent",
                self.received_bytes
            ));
        }
        if let Some(v) = self.verification {
            if v.elements != total / 4 {
                return Err(format!(
                    "the receiver's ack counts {} elements, but {} were sent",
                    v.elements,
                    total / 4
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RAW_REPLY;

    #[test]
    fn an_ack_carries_the_digest_and_the_repairs() {
        let ack = Ack::checked(4097, None, Some(0xdead_beef), 3);
        assert_eq!(ack.status, AckStatus::Verified);
        assert_eq!(Ack::decode(&ack.encode()), Ok(ack));
        let failed = ack.with_status(AckStatus::ChecksumFailed);
        assert_eq!(Ack::decode(&failed.encode()), Ok(failed));
        let unstored = ack.with_status(AckStatus::NotStored);
        assert_eq!(Ack::decode(&unstored.encode()), Ok(unstored));
    }

    #[test]
    fn an_ack_must_speak_of_what_was_sent() {
        let v = |elements| Verification {
            elements,
            mismatches: 0,
            first_mismatch: None,
            crc32: None,
        };
        assert_eq!(Ack::new(4096, Some(v(1024))).check_counts(4096), Ok(()));
        assert!(Ack::new(8192, Some(v(2048)))
            .check_counts(4096)
            .unwrap_err()
            .contains("8192 bytes, but 4096 were sent"));
        assert!(Ack::new(4096, Some(v(1)))
            .check_counts(4096)
            .unwrap_err()
            .contains("counts 1 elements, but 1024"));
        assert_eq!(Ack::new(4096, None).check_counts(4096), Ok(()));
        assert_eq!(Ack::too_slow(12).check_counts(4096), Ok(()));
    }

    #[test]
    fn ack_round_trip() {
        let verified = Ack::new(
            16384,
            Some(Verification {
                elements: 4096,
                mismatches: 0,
                first_mismatch: None,
                crc32: Some(0xdead_beef),
            }),
        );
        assert_eq!(verified.status, AckStatus::Verified);
        let mismatch = Ack::new(
            16,
            Some(Verification {
                elements: 4,
                mismatches: 3,
                first_mismatch: Some(1),
                crc32: None,
            }),
        );
        assert_eq!(mismatch.status, AckStatus::Mismatch);
        let failed = Ack::new(1 << 20, None);
        assert_eq!(failed.status, AckStatus::VerifyFailed);
        let slow = Ack::decode(&Ack::too_slow(1 << 20).encode()).unwrap();
        assert_eq!(
            (slow.status, slow.received_bytes, slow.verification),
            (AckStatus::TooSlow, 1 << 20, None)
        );
        let timed = verified.with_verify_time(std::time::Duration::from_micros(1234));
        assert_eq!(timed.verify_micros, Some(1234));
        let saturated = failed.with_verify_time(std::time::Duration::from_secs(1 << 40));
        assert_eq!(saturated.verify_micros, Some(u32::MAX));
        // Without a verify time the reserved bytes stay zero (what older senders expect).
        assert_eq!(&verified.encode()[44..48], &[0; 4]);
        assert_eq!(verified.encode()[7] & ACK_HAS_VERIFY_TIME, 0);
        for ack in [verified, mismatch, failed, timed, saturated] {
            let bytes = ack.encode();
            assert_eq!(Ack::decode(&bytes), Ok(ack));
        }
    }

    #[test]
    fn ack_rejects_garbage() {
        let good = Ack::new(
            16,
            Some(Verification {
                elements: 4,
                mismatches: 0,
                first_mismatch: None,
                crc32: None,
            }),
        )
        .encode();
        assert!(matches!(
            Ack::decode(&good[..40]),
            Err(WireError::Short { .. })
        ));
        let mut bad = good;
        bad[6] = 9;
        assert_eq!(Ack::decode(&bad), Err(WireError::UnknownStatus { code: 9 }));
        let mut bad = good;
        bad[7] |= 0x40;
        assert!(matches!(
            Ack::decode(&bad),
            Err(WireError::UnknownFlags { .. })
        ));
        // "verified" with mismatches is a lie.
        let mut bad = good;
        bad[24] = 1;
        assert!(matches!(
            Ack::decode(&bad),
            Err(WireError::Inconsistent { .. })
        ));
        assert!(matches!(
            Ack::decode(&RAW_REPLY),
            Err(WireError::BadMagic { .. })
        ));
    }
}
