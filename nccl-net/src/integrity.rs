//! The integrity of each piece: its CRC32C (Castagnoli; `host::integrity`'s, the
//! `crc-fast` crate: VPCLMULQDQ with AVX-512 where the CPU has it, about 4 times the SSE4.2
//! `crc32` instruction's rate, else PCLMULQDQ, the `crc32` instruction, ARMv8's), the test-only fault injector
//! that corrupts a piece after its CRC was taken, and the counters NCCL's log gets.

use std::sync::atomic::{AtomicU64, Ordering};

pub use host::integrity::{cpu_path as crc32c_path, crc32c};

/// The largest message NCCL may send under its LL or LL128 protocol: a step of those
/// protocols' buffers (`NCCL_LL_BUFFSIZE` / `NCCL_LL128_BUFFSIZE` over NCCL_STEPS = 8;
/// by default 512 KiB and about 4.7 MiB, so 64 KiB and 600 KiB steps), at least 1 MiB.
/// Under those protocols the receiving GPU reads NCCL's buffer as soon as each line's
/// flag is there, not after `test` says done (as it does under Simple), so a piece whose
/// bytes fail their CRC32C must never reach the buffer at all: the GPU would take them
/// before the resend could mend them (seen on an H100: an all_reduce of 4 KiB not
/// bit-exact with faults injected at 1 in 1000, when such pieces landed in place). So
/// over TCP such pieces are read into a reader's scratch buffer first, and over verbs
/// such receives are written into a registered staging buffer of the comm: copied into
/// NCCL's buffer only once their CRC32C passed.
pub fn flag_polled_max() -> u64 {
    static MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let step = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(0, |bytes| bytes / NCCL_STEPS)
        };
        (1u64 << 20)
            .max(step("NCCL_LL_BUFFSIZE"))
            .max(step("NCCL_LL128_BUFFSIZE"))
    })
}

/// Steps per protocol buffer in NCCL (`NCCL_STEPS`).
const NCCL_STEPS: u64 = 8;

/// Whether a checked message of `total` bytes (a receive posted for that many, over
/// verbs) goes through a buffer of this plugin's before NCCL's ([`flag_polled_max`] says
/// why).
pub fn must_stage(checked: bool, total: u64) -> bool {
    checked && total <= flag_polled_max()
}

/// Decides which pieces `NCCL_GRDMA_TEST_INJECT_FAULTS=N` corrupts: about one in N,
/// from a xorshift generator seeded per comm (reproducible for one seed), never a
/// piece's last allowed attempt unless N is 1: at N = 3, nine corrupt attempts in a row
/// (one piece in about 20 000) would fail the comm, and a test of repair would fail by
/// chance; N = 1 still corrupts every attempt, to test the bound.
#[derive(Debug)]
pub struct FaultInjector {
    one_in: u32,
    state: u64,
}

impl FaultInjector {
    pub fn new(one_in: u32, seed: u64) -> Self {
        Self {
            one_in,
            state: seed | 1,
        }
    }

    /// True for the pieces to corrupt, `last`: the piece's last allowed attempt.
    pub fn strike_attempt(&mut self, last: bool) -> bool {
        match last && self.one_in > 1 {
            true => false,
            false => self.strike(),
        }
    }

    /// True for the pieces to corrupt.
    pub fn strike(&mut self) -> bool {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.one_in == 1 || self.state.is_multiple_of(self.one_in as u64)
    }
}

/// Messages and bytes moved, and pieces sent again after a failed CRC32C (each time:
/// a piece that failed twice counts two; a message is done only once all passed, so on
/// a comm that did not fail every one was repaired in the end). Sent messages count
/// when `test` reports them done, which for a small one is before its ack (its copy
/// kept for resends): a comm that fails later may have counted some the peer never
/// took whole.
/// One per comm, summed into the process's totals when the comm closes.
#[derive(Debug, Default)]
pub struct Counters {
    pub messages: u64,
    pub bytes: u64,
    pub repaired: u64,
    pub injected: u64,
}

impl Counters {
    pub fn line(&self) -> String {
        format!(
            "{} messages, {} bytes, {} pieces sent again after a failed CRC32C{}",
            self.messages,
            self.bytes,
            self.repaired,
            if self.injected > 0 {
                format!(
                    " ({} corrupted on purpose by NCCL_GRDMA_TEST_INJECT_FAULTS)",
                    self.injected
                )
            } else {
                String::new()
            }
        )
    }
}

/// The process's totals since it loaded the plugin, per direction.
pub struct Totals {
    messages: AtomicU64,
    bytes: AtomicU64,
    repaired: AtomicU64,
    injected: AtomicU64,
}

pub static SENT: Totals = Totals::new();
pub static RECEIVED: Totals = Totals::new();

impl Totals {
    const fn new() -> Self {
        Self {
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    pub fn add(&self, c: &Counters) {
        self.messages.fetch_add(c.messages, Ordering::Relaxed);
        self.bytes.fetch_add(c.bytes, Ordering::Relaxed);
        self.repaired.fetch_add(c.repaired, Ordering::Relaxed);
        self.injected.fetch_add(c.injected, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Counters {
        Counters {
            messages: self.messages.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            repaired: self.repaired.load(Ordering::Relaxed),
            injected: self.injected.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // The CRC32C check value (RFC 3720 B.4): "123456789" -> 0xE3069283.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        // Another implementation, over lengths around the SIMD paths' blocks and odd starts.
        let data: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in (0..600).chain(4090..4100).chain(8000..8010) {
            for start in [0, 1, 5, 13] {
                let bytes = &data[start..start + len];
                assert_eq!(
                    crc32c(bytes),
                    crc32c::crc32c(bytes),
                    "{len} bytes at +{start}"
                );
            }
        }
    }

    #[test]
    fn injector_rate() {
        let mut f = FaultInjector::new(10, 42);
        let hits = (0..100_000).filter(|_| f.strike()).count();
        assert!((8_000..12_000).contains(&hits), "{hits}");
        let mut all = FaultInjector::new(1, 42);
        assert!((0..100).all(|_| all.strike()));
        // A piece's last allowed attempt goes through, but where every attempt is to be
        // corrupted (the bound's test).
        let mut f = FaultInjector::new(2, 42);
        assert!((0..1000).all(|_| !f.strike_attempt(true)));
        assert!((0..1000).any(|_| f.strike_attempt(false)));
        assert!((0..100).all(|_| all.strike_attempt(true)));
    }

    #[test]
    fn counters_line() {
        let c = Counters {
            messages: 3,
            bytes: 4096,
            repaired: 1,
            injected: 0,
        };
        assert_eq!(
            c.line(),
            "3 messages, 4096 bytes, 1 pieces sent again after a failed CRC32C"
        );
    }
}
