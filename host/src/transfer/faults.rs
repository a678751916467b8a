//! The fault injector, for tests only: it flips one bit in a chosen fraction of chunks
//! on the sender's side of the wire, after the chunk's checksum was computed, so the
//! receiver's checks and the repair path can be shown to work on real transfers. Beside
//! it, the lies a verbs sender can be told to tell ([`PeerLie`]), for the same purpose.
//!
//! It exists only where it is named: the sender's `--test-inject-faults 1/N` (documented
//! as a test option in `docs/cli.md`); a sender using it says so on stderr and in its
//! JSON. Which chunks are hit is a pure function of the chunk, the attempt and a seed,
//! so a run is reproducible and a resent chunk is hit again only with the same chance.

/// TEST ONLY (`--test-peer-lies`): a verbs sender that breaks the protocol on purpose,
/// in the first sending of its items, to show what a receiver does with a peer that lies
/// over a queue pair (what TCP's frames cannot carry: a wrong immediate, a SEND longer
/// than the receive posted for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerLie {
    /// Every immediate of a first sending names an item 2^31 past the one it carries
    /// (and a single rail's SENDs, which carry none, carry one).
    Index,
    /// The first SEND of item 0 carries one byte more than the item.
    Oversize,
    /// Over WRITE: the last item's place written again with its first byte changed,
    /// from a moment after the sender's CRC32Cs went until its transfer ends (bytes
    /// that change after the receiver checked them).
    Rewrite,
}

impl PeerLie {
    /// `index`, `oversize` or `rewrite`.
    pub fn parse(spec: &str) -> Result<PeerLie, String> {
        match spec {
            "index" => Ok(PeerLie::Index),
            "oversize" => Ok(PeerLie::Oversize),
            "rewrite" => Ok(PeerLie::Rewrite),
            _ => Err(format!(
                "--test-peer-lies {spec:?}: expected index (immediates that name no item), oversize (a SEND longer than its receive) or rewrite (WRITEs into the receiver's buffer after its check, --op write)"
            )),
        }
    }
}

/// Flips one bit in about one chunk in `one_in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultInjector {
    pub one_in: u64,
    pub seed: u64,
}

impl FaultInjector {
    /// `1/N` (N ≥ 1): one chunk in N on average; `1/1` hits every chunk, every attempt.
    pub fn parse(spec: &str) -> Result<FaultInjector, String> {
        let bad = || {
            format!("--test-inject-faults {spec:?}: expected 1/N with N a whole number of at least 1, as 1/100")
        };
        let (one, n) = spec.split_once('/').ok_or_else(bad)?;
        let one_in: u64 = n.trim().parse().map_err(|_| bad())?;
        if one.trim() != "1" || one_in == 0 {
            return Err(bad());
        }
        Ok(FaultInjector {
            one_in,
            seed: 0x5eed,
        })
    }

    fn mix(&self, chunk: u64, attempt: u32) -> u64 {
        // splitmix64 over the three inputs: well spread, no dependency.
        let mut z = self
            .seed
            .wrapping_add(chunk.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add((attempt as u64).wrapping_mul(0xd1b5_4a32_d192_ed03));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Whether attempt `attempt` (0: the first sending) of chunk `chunk` is corrupted.
    pub fn hits(&self, chunk: u64, attempt: u32) -> bool {
        self.mix(chunk, attempt).is_multiple_of(self.one_in)
    }

    /// Flip one bit of `bytes` if this attempt of this chunk is hit; whether it was.
    pub fn corrupt(&self, bytes: &mut [u8], chunk: u64, attempt: u32) -> bool {
        if bytes.is_empty() || !self.hits(chunk, attempt) {
            return false;
        }
        let h = self.mix(chunk, attempt.wrapping_add(1 << 31));
        let bit = h % (bytes.len() as u64 * 8);
        bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_lies_in_one_of_two_named_ways() {
        assert_eq!(PeerLie::parse("index"), Ok(PeerLie::Index));
        assert_eq!(PeerLie::parse("oversize"), Ok(PeerLie::Oversize));
        for bad in ["", "Index", "flood", "index "] {
            let e = PeerLie::parse(bad).unwrap_err();
            assert!(
                e.contains("expected index") && e.contains("oversize"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_spec_is_one_in_n() {
        assert_eq!(FaultInjector::parse("1/100").unwrap().one_in, 100);
        assert_eq!(FaultInjector::parse("1/1").unwrap().one_in, 1);
        for bad in ["", "100", "2/100", "1/0", "1/x", "1/-3"] {
            let e = FaultInjector::parse(bad).unwrap_err();
            assert!(e.contains("expected 1/N"), "{e}");
        }
    }

    #[test]
    fn about_one_chunk_in_n_is_hit_by_exactly_one_bit() {
        let f = FaultInjector::parse("1/100").unwrap();
        let hit = (0..100_000u64).filter(|&c| f.hits(c, 0)).count();
        assert!((800..1200).contains(&hit), "{hit} of 100000");
        // A resend is hit independently of the first attempt.
        let again = (0..100_000u64)
            .filter(|&c| f.hits(c, 0) && f.hits(c, 1))
            .count();
        assert!(again < 40, "{again}");
        let mut flipped = 0;
        for c in 0..10_000u64 {
            let mut bytes = vec![0u8; 4097];
            if f.corrupt(&mut bytes, c, 0) {
                flipped += 1;
                let ones: u32 = bytes.iter().map(|b| b.count_ones()).sum();
                assert_eq!(ones, 1);
            } else {
                assert!(bytes.iter().all(|&b| b == 0));
            }
        }
        assert!(flipped > 50, "{flipped}");
        let every = FaultInjector::parse("1/1").unwrap();
        assert!((0..1000).all(|c| every.hits(c, c as u32)));
    }
}
