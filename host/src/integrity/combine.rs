//! The CRC combine rule with its operator built once: CRC(A ‖ B) = shift(CRC(A), |B|) ⊕
//! CRC(B), where `shift` feeds |B| zero bytes through the CRC register. That shift is
//! linear over GF(2), a 32×32 bit matrix, built by squaring (the method of zlib's
//! `crc32_combine`); a transfer's chunks are all the same length but the last, so one
//! matrix serves them all and each combine is 32 conditional XORs.

/// The reflected CRC32C (Castagnoli) polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The operator that moves a CRC past some number of zero bytes: column `i` is the
/// image of bit `i`.
#[derive(Clone, Copy)]
pub struct Shift([u32; 32]);

impl Shift {
    const IDENTITY: Shift = {
        let mut m = [0u32; 32];
        let mut i = 0;
        while i < 32 {
            m[i] = 1 << i;
            i += 1;
        }
        Shift(m)
    };

    /// One zero bit: the register shifts right, the polynomial enters where bit 0 left.
    fn one_bit() -> Shift {
        let mut m = [0u32; 32];
        m[0] = POLY;
        for (i, col) in m.iter_mut().enumerate().skip(1) {
            *col = 1 << (i - 1);
        }
        Shift(m)
    }

    /// `self` applied to the CRC register `v`.
    pub fn apply(&self, mut v: u32) -> u32 {
        let mut sum = 0;
        let mut i = 0;
        while v != 0 {
            if v & 1 == 1 {
                sum ^= self.0[i];
            }
            v >>= 1;
            i += 1;
        }
        sum
    }

    /// `self` after `other`.
    fn after(&self, other: &Shift) -> Shift {
        let mut m = [0u32; 32];
        for (col, &o) in m.iter_mut().zip(other.0.iter()) {
            *col = self.apply(o);
        }
        Shift(m)
    }

    /// The shift past `bytes` zero bytes.
    pub fn by(bytes: u64) -> Shift {
        let mut power = Shift::one_bit();
        for _ in 0..3 {
            power = power.after(&power); // 2, 4, 8 bits: one byte
        }
        let mut result = Shift::IDENTITY;
        let mut n = bytes;
        while n != 0 {
            if n & 1 == 1 {
                result = power.after(&result);
            }
            power = power.after(&power);
            n >>= 1;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_combines_as_the_crate_does_and_as_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..70_001u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect();
        for split in [0usize, 1, 3, 4096, 65_536, 70_000, 70_001] {
            let (a, b) = data.split_at(split);
            let (ca, cb) = (crc32c::crc32c(a), crc32c::crc32c(b));
            let ours = Shift::by(b.len() as u64).apply(ca) ^ cb;
            assert_eq!(
                ours,
                crc32c::crc32c_combine(ca, cb, b.len()),
                "split {split}"
            );
            assert_eq!(ours, crc32c::crc32c(&data), "split {split}");
        }
        assert_eq!(Shift::by(0).apply(0xdead_beef), 0xdead_beef);
    }
}
