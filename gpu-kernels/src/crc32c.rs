//! CRC32C (Castagnoli) arithmetic in plain `no_std` Rust: the tables, the GF(2) shift
//! ("append n zero bytes") and the per-row step of the GPU kernel `crc32c_chunks`.
//!
//! The kernel (`kernels.rs`) calls exactly these functions, and the host's tests call
//! them too, against published check values and the `crc32c` crate.
//!
//! # Representation
//! Reflected, as every CRC32C implementation (iSCSI, ext4, SSE4.2's `crc32`): bit 31 of a
//! `u32` is the coefficient of x^0 and bit 0 that of x^31, so the polynomial `1` is
//! `0x8000_0000` and multiplying by `x` is a right shift. A *register* is the CRC state
//! without the standard pre- and post-inversion: `crc32c(data) = !register(!0, data)`.
//!
//! # Why the GPU can split the work
//! The register is linear over GF(2): `register(s, A ++ B) = shift(register(s, A), |B|)
//! ^ register(0, B)`, where `shift(c, n) = c * x^(8n) mod P` is "c followed by n zero
//! bytes". So any part of a chunk can be computed alone, from state 0, and moved to its
//! place with one multiplication mod P ([`mul`] by [`x8n`]); the parts are then XORed.
//! That is the CRC combine rule (zlib's `crc32_combine`), with `x^(8n)` taken from a
//! table of `x^(8*2^k)` instead of zlib's matrix squaring.

/// The Castagnoli polynomial 0x1EDC6F41, bit-reversed.
pub const POLY: u32 = 0x82F6_3B78;

/// The polynomial `1` in the reflected representation.
pub const ONE: u32 = 0x8000_0000;

/// `b * x mod P`.
#[inline(always)]
pub const fn times_x(b: u32) -> u32 {
    (b >> 1) ^ (POLY & (b & 1).wrapping_neg())
}

/// `b * x^-1 mod P`: the inverse of [`times_x`]. P has a constant term, so `x` is
/// invertible; `times_x` leaves bit 31 set exactly when it folded in `POLY`.
pub const fn times_x_inverse(b: u32) -> u32 {
    if b & ONE != 0 {
        ((b ^ POLY) << 1) | 1
    } else {
        b << 1
    }
}

/// `a * b mod P`, branch-free (32 rounds of shift, mask, xor), so a warp never diverges.
#[inline(always)]
pub const fn mul(a: u32, b: u32) -> u32 {
    let (mut a, mut b, mut product) = (a, b, 0u32);
    let mut i = 0;
    while i < 32 {
        // The mask is all ones when a's coefficient of x^i (bit 31 after i shifts) is 1.
        product ^= b & ((a as i32) >> 31) as u32;
        a <<= 1;
        b = times_x(b);
        i += 1;
    }
    product
}

/// `X8_POWERS[k] = x^(8 * 2^k) mod P`: the shift by 2^k bytes.
pub static X8_POWERS: [u32; 64] = x8_powers();

const fn x8_powers() -> [u32; 64] {
    let mut table = [0u32; 64];
    let mut p = ONE;
    let mut i = 0;
    while i < 8 {
        p = times_x(p);
        i += 1;
    }
    let mut k = 0;
    while k < 64 {
        table[k] = p;
        p = mul(p, p);
        k += 1;
    }
    table
}

/// `x^(8n) mod P`: one product per set bit of `n`.
#[inline(always)]
pub fn x8n(n: u64) -> u32 {
    let (mut n, mut k, mut power) = (n, 0, ONE);
    while n != 0 {
        if n & 1 != 0 {
            power = mul(power, X8_POWERS[k]);
        }
        n >>= 1;
        k += 1;
    }
    power
}

/// The register `crc` followed by `n` zero bytes.
#[inline(always)]
pub fn shift(crc: u32, n: u64) -> u32 {
    if n == 0 {
        crc
    } else {
        mul(crc, x8n(n))
    }
}

/// The classic byte table: `BYTE_TABLE[v]` is the register after the byte `v` from 0.
pub static BYTE_TABLE: [u32; 256] = byte_table();

const fn byte_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut v = 0;
    while v < 256 {
        let mut c = v as u32;
        let mut bit = 0;
        while bit < 8 {
            c = times_x(c);
            bit += 1;
        }
        table[v] = c;
        v += 1;
    }
    table
}

/// The register `crc` after `data`, a byte at a time (the kernel's short heads and tails).
#[inline(always)]
pub fn update_bytes(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = BYTE_TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// The CRC32C of `data` (pre- and post-inverted, as published check values are).
pub fn crc32c(data: &[u8]) -> u32 {
    !update_bytes(!0, data)
}

/// The CRC32C of a chunk whose register from 0 is `raw`, `len` bytes long: the
/// pre-inversion, moved to the chunk's end, and the post-inversion.
#[inline(always)]
pub fn finish(raw: u32, len: u64) -> u32 {
    !(raw ^ shift(!0, len))
}

/// The term the kernel adds to a chunk's raw register to make it a CRC32C:
/// `finish(raw, len) == raw ^ init_term(len)`.
#[inline(always)]
pub fn init_term(len: u64) -> u32 {
    !shift(!0, len)
}

// ---- The kernel's layout -------------------------------------------------------------
//
// A warp reads its part of a chunk in *rows* of 512 bytes, lane `l` taking the 16 bytes at
// `16 * l` of each row, so each load instruction of the warp reads 512 contiguous bytes.
// Lane `l` thus sees its own stream: its 16 bytes of row 0, the other lanes' 496 bytes
// (as if they were zero), its 16 bytes of row 1, and so on. It keeps the register of
// that stream *after* the 496 zero bytes that follow its last 16, and [`row_step`] adds
// one row: xor the register into the first 4 bytes, look up each of the 16 bytes in the
// table of its distance from the end (plus the 496-byte gap, folded into the tables), xor.
// After the last row, lane `l`'s stream has run 16 * l bytes past the rows' end, which
// [`LANE_UNSHIFT`] takes back (x^-128l); then the 32 lanes' values are XORed.

/// Bytes per lane per row: one 16-byte vector load.
pub const LANE_BYTES: usize = 16;
/// Lanes in a warp.
pub const LANES: usize = 32;
/// Bytes per row: a warp's 32 vector loads.
pub const ROW_BYTES: usize = LANE_BYTES * LANES;
/// The other lanes' bytes between two of one lane's vectors.
pub const GAP_BYTES: usize = ROW_BYTES - LANE_BYTES;

/// `ROW_TABLES[k][v]`: the register after byte `v` followed by `k + GAP_BYTES` zero bytes.
/// Byte `j` (0..16) of a lane's vector is looked up in table `15 - j`. 16 KiB: the kernel
/// copies it into shared memory.
pub static ROW_TABLES: [[u32; 256]; LANE_BYTES] = row_tables();

const fn row_tables() -> [[u32; 256]; LANE_BYTES] {
    let byte = byte_table();
    let mut tables = [[0u32; 256]; LANE_BYTES];
    // x^(8 * (GAP_BYTES + k)) for k = 0, by repeated multiplication by x.
    let mut power = ONE;
    let mut i = 0;
    while i < 8 * GAP_BYTES {
        power = times_x(power);
        i += 1;
    }
    let mut k = 0;
    while k < LANE_BYTES {
        let mut v = 0;
        while v < 256 {
            tables[k][v] = mul(byte[v], power);
            v += 1;
        }
        let mut bit = 0;
        while bit < 8 {
            power = times_x(power);
            bit += 1;
        }
        k += 1;
    }
    tables
}

/// `LANE_UNSHIFT[l] = x^(-8 * 16 * l) mod P`: lane `l`'s register ran `16 * l` bytes past
/// the end of the rows; this takes it back.
pub static LANE_UNSHIFT: [u32; LANES] = lane_unshift();

const fn lane_unshift() -> [u32; LANES] {
    let mut table = [0u32; LANES];
    let mut power = ONE;
    let mut l = 0;
    while l < LANES {
        table[l] = power;
        let mut i = 0;
        while i < 8 * LANE_BYTES {
            power = times_x_inverse(power);
            i += 1;
        }
        l += 1;
    }
    table
}

/// One row for one lane: `register` is the lane's register so far (see above), `words`
/// its 16 bytes as four little-endian `u32`s, `table(k, v)` reads `ROW_TABLES[k][v]`
/// (from shared memory on the GPU).
#[inline(always)]
pub fn row_step(register: u32, words: [u32; 4], table: impl Fn(usize, u32) -> u32) -> u32 {
    let mut out = 0;
    let mut j = 0;
    while j < 4 {
        let w = if j == 0 {
            words[0] ^ register
        } else {
            words[j]
        };
        let k = 15 - 4 * j;
        out ^= table(k, w & 0xff)
            ^ table(k - 1, (w >> 8) & 0xff)
            ^ table(k - 2, (w >> 16) & 0xff)
            ^ table(k - 3, w >> 24);
        j += 1;
    }
    out
}

/// Where the kernel's warp `w` works, for a buffer of `len` bytes split into chunks of
/// `chunk` bytes, each split into pieces of `piece` bytes (the last of each may be short).
/// Every chunk gets `pieces_per_chunk(chunk, piece)` warps; those past the end of a short
/// last chunk get `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub chunk: u64,
    /// Byte offsets in the buffer: the chunk and this piece of it.
    pub chunk_start: u64,
    pub chunk_end: u64,
    pub start: u64,
    pub end: u64,
}

/// Pieces per chunk: `ceil(chunk / piece)`.
#[inline(always)]
pub fn pieces_per_chunk(chunk: u64, piece: u64) -> u64 {
    chunk.div_ceil(piece)
}

/// Chunks in a buffer of `len` bytes.
#[inline(always)]
pub fn chunk_count(len: u64, chunk: u64) -> u64 {
    len.div_ceil(chunk)
}

/// The chunk and piece sizes a launch works with (`chunk` and `piece` nonzero): a chunk
/// longer than the buffer is the buffer (the same one chunk), a piece longer than its
/// chunk is the chunk. Without this a chunk of `u64::MAX` bytes in pieces of 4 KiB
/// asked for 2^52 warps over an 8 KiB buffer: a launch that never ended.
#[inline(always)]
pub fn launch_shape(len: u64, chunk: u64, piece: u64) -> (u64, u64) {
    let chunk = chunk.min(len.max(1));
    (chunk, piece.min(chunk))
}

/// The warps a launch needs: every chunk's pieces. With the sizes [`launch_shape`] gives,
/// at most `2 * len` (at most a piece per byte, plus a short last chunk's share).
#[inline(always)]
pub fn warps_needed(len: u64, chunk: u64, piece: u64) -> u64 {
    chunk_count(len, chunk).saturating_mul(pieces_per_chunk(chunk, piece))
}

/// Warp `w`'s piece (`chunk` and `piece` nonzero). Every sum and product is checked: a
/// chunk or piece near `u64::MAX` (a caller's mistake the host refuses, but the kernel
/// must not trust) gives the warp no piece, or one that ends where its chunk and the
/// buffer end, never an end that wrapped past `len`.
#[inline(always)]
pub fn piece_of_warp(w: u64, len: u64, chunk: u64, piece: u64) -> Option<Piece> {
    let per_chunk = pieces_per_chunk(chunk, piece);
    let c = w / per_chunk;
    let chunk_start = c.checked_mul(chunk)?;
    let start = chunk_start.checked_add((w % per_chunk).checked_mul(piece)?)?;
    if start >= len {
        return None;
    }
    let chunk_end = chunk_start.saturating_add(chunk).min(len);
    Some(Piece {
        chunk: c,
        chunk_start,
        chunk_end,
        start,
        end: start.saturating_add(piece).min(chunk_end),
    })
}

/// How a warp splits a piece at device address `address` (only its alignment counts),
/// `len` bytes long: a head of 0..15 bytes up to the first 16-byte boundary (done
/// byte by byte), whole rows, and a tail of 0..511 bytes (each lane a 16-byte part of it,
/// byte by byte). Returns (head bytes, rows).
#[inline(always)]
pub fn split_piece(address: u64, len: u64) -> (u64, u64) {
    let head = (address.wrapping_neg() % LANE_BYTES as u64).min(len);
    (head, (len - head) / ROW_BYTES as u64)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn published_check_values() {
        // The catalogue's check value (CRC-32/ISCSI) and RFC 3720's B.4 test vectors.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        let descending: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&descending), 0x113F_DB5C);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn agrees_with_the_crc32c_crate() {
        for n in [0usize, 1, 3, 4, 15, 16, 17, 511, 512, 513, 4097, 100_003] {
            let data = random_bytes(n, n as u64 + 7);
            assert_eq!(crc32c(&data), ::crc32c::crc32c(&data), "{n} bytes");
        }
    }

    #[test]
    fn x_and_its_inverse_cancel() {
        for v in [ONE, 1, POLY, 0xDEAD_BEEF, 0x1234_5678] {
            assert_eq!(times_x_inverse(times_x(v)), v);
            assert_eq!(times_x(times_x_inverse(v)), v);
        }
        for (l, &unshift) in LANE_UNSHIFT.iter().enumerate() {
            // x^-128l * x^128l = 1
            assert_eq!(mul(unshift, x8n(16 * l as u64)), ONE, "lane {l}");
        }
    }

    #[test]
    fn mul_is_a_commutative_product_with_one() {
        for (a, b) in [
            (0x1234_5678u32, 0x9ABC_DEF0u32),
            (ONE, 77),
            (0, 5),
            (POLY, POLY),
        ] {
            assert_eq!(mul(a, b), mul(b, a));
            assert_eq!(mul(a, ONE), a);
        }
        assert_eq!(x8n(0), ONE);
        assert_eq!(mul(x8n(3), x8n(5)), x8n(8));
    }

    #[test]
    fn the_combine_rule_joins_any_split() {
        let data = random_bytes(5000, 3);
        for cut in [0usize, 1, 7, 16, 2500, 4999, 5000] {
            let (a, b) = data.split_at(cut);
            let joined = shift(update_bytes(0, a), b.len() as u64) ^ update_bytes(0, b);
            assert_eq!(joined, update_bytes(0, &data), "cut at {cut}");
            // And against the crc32c crate's own combine.
            assert_eq!(
                ::crc32c::crc32c_combine(crc32c(a), crc32c(b), b.len()),
                crc32c(&data)
            );
        }
        assert_eq!(finish(update_bytes(0, &data), 5000), crc32c(&data));
        assert_eq!(
            update_bytes(0, &data) ^ init_term(5000),
            ::crc32c::crc32c(&data)
        );
    }

    /// The kernel's warp algorithm replayed on the CPU: head by lane 0, rows with
    /// `row_step` per lane, lane unshift, tail parts per lane, XOR of everything.
    pub(super) fn warp_model(address: u64, data: &[u8]) -> u32 {
        let len = data.len() as u64;
        let (head, rows) = split_piece(address, len);
        let mut lanes = [0u32; LANES];
        lanes[0] = update_bytes(0, &data[..head as usize]);
        for r in 0..rows as usize {
            for (l, register) in lanes.iter_mut().enumerate() {
                let at = head as usize + r * ROW_BYTES + l * LANE_BYTES;
                let w = |i: usize| {
                    u32::from_le_bytes(data[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
                };
                *register = row_step(*register, [w(0), w(1), w(2), w(3)], |k, v| {
                    ROW_TABLES[k][v as usize]
                });
            }
        }
        let body_end = head + rows * ROW_BYTES as u64;
        let tail = len - body_end;
        let mut total = 0;
        for (l, register) in lanes.iter().enumerate() {
            let body = shift(mul(*register, LANE_UNSHIFT[l]), tail);
            let from = (body_end + (l * LANE_BYTES) as u64).min(len);
            let to = (from + LANE_BYTES as u64).min(len);
            let part = shift(update_bytes(0, &data[from as usize..to as usize]), len - to);
            total ^= body ^ part;
        }
        total
    }

    #[test]
    fn the_warp_algorithm_equals_the_plain_register() {
        let data = random_bytes(3 * ROW_BYTES * 4 + 777, 11);
        for misalign in [0u64, 1, 3, 8, 15] {
            for len in [
                0usize,
                1,
                15,
                16,
                17,
                511,
                512,
                513,
                1024 + 31,
                4096,
                data.len() - 16,
            ] {
                let slice = &data[..len];
                assert_eq!(
                    warp_model(0x1000 + misalign, slice),
                    update_bytes(0, slice),
                    "{len} bytes at misalignment {misalign}"
                );
            }
        }
    }

    /// Issue 24, item 11: a piece of `u64::MAX` bytes made `start + piece` wrap, so a warp's
    /// piece ran to `u64::MAX` and the kernel read past the buffer (a debug build panicked
    /// here with "attempt to add with overflow"). Now every piece stays inside the buffer.
    #[test]
    fn pieces_near_u64_max_stay_inside_the_buffer() {
        for (len, chunk, piece) in [
            (8192u64, 4096u64, u64::MAX),
            (8192, u64::MAX, 4096),
            (8192, u64::MAX, u64::MAX),
            (8192, u64::MAX - 1, u64::MAX / 2 + 1),
            (u64::MAX, u64::MAX / 2 + 1, u64::MAX / 2),
        ] {
            let warps = warps_needed(len.min(1 << 20), chunk, piece);
            for w in (0..warps.min(64)).chain([u64::MAX / 2, u64::MAX]) {
                if let Some(p) = piece_of_warp(w, len, chunk, piece) {
                    assert!(
                        p.chunk_start <= p.start && p.start < p.end && p.end <= p.chunk_end,
                        "{len}/{chunk}/{piece} warp {w}: {p:?}"
                    );
                    assert!(p.chunk_end <= len, "{len}/{chunk}/{piece} warp {w}: {p:?}");
                }
            }
        }
        let p = piece_of_warp(1, 8192, 4096, u64::MAX).unwrap();
        assert_eq!((p.start, p.end), (4096, 8192));
    }

    #[test]
    fn a_launch_never_needs_more_than_two_warps_per_byte() {
        // The kernel's loop runs to warps_needed of launch_shape's sizes: a chunk of
        // u64::MAX bytes in 4 KiB pieces over 8 KiB asked for 2^52 warps before.
        for (len, chunk, piece) in [
            (8192u64, u64::MAX, 4096u64),
            (8192, u64::MAX, u64::MAX),
            (8192, u64::MAX - 1, 1),
            (1, u64::MAX, 1),
            (0, u64::MAX, 1),
            (4097, 4096, 1),
            (1 << 20, 3, 2),
        ] {
            let (c, p) = launch_shape(len, chunk, piece);
            let warps = warps_needed(len, c, p);
            assert!(
                warps <= 2 * len.max(1),
                "{len}/{chunk}/{piece}: {warps} warps"
            );
            // The same pieces as the sizes asked for: every byte once.
            let mut seen = 0;
            for w in 0..warps {
                if let Some(piece) = piece_of_warp(w, len, c, p) {
                    seen += piece.end - piece.start;
                }
            }
            assert_eq!(seen, len, "{len}/{chunk}/{piece}");
        }
    }

    #[test]
    fn pieces_cover_every_byte_once_and_stay_in_their_chunk() {
        for (len, chunk, piece) in [
            (1u64, 1u64, 1u64),
            (10, 3, 2),
            (4097, 4097, 65536),
            (4097, 1000, 512),
            ((1 << 20) + 3, 65536 + 5, 16384),
            (1 << 20, 1 << 20, 1 << 16),
        ] {
            let mut seen = std::vec![0u8; len as usize];
            let warps = warps_needed(len, chunk, piece);
            for w in 0..warps {
                if let Some(p) = piece_of_warp(w, len, chunk, piece) {
                    assert!(p.chunk_start <= p.start && p.start < p.end && p.end <= p.chunk_end);
                    assert_eq!(p.chunk, p.start / chunk);
                    for b in p.start..p.end {
                        seen[b as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{len}/{chunk}/{piece}");
            assert!(piece_of_warp(warps, len, chunk, piece).is_none());
        }
    }

    #[test]
    fn chunk_crcs_from_pieces_equal_the_crate() {
        // The whole kernel on the CPU: every warp's piece, moved to its chunk's end and
        // XORed in, plus the chunk's init term once.
        let data = random_bytes(200_003, 5);
        let len = data.len() as u64;
        for (chunk, piece) in [
            (4097u64, 1024u64),
            (65536, 65536),
            (100_000, 7000),
            (len, 512),
        ] {
            let mut out = std::vec![0u32; chunk_count(len, chunk) as usize];
            for w in 0..warps_needed(len, chunk, piece) {
                let Some(p) = piece_of_warp(w, len, chunk, piece) else {
                    continue;
                };
                let raw = warp_model(0x40 + p.start, &data[p.start as usize..p.end as usize]);
                let mut v = shift(raw, p.chunk_end - p.end);
                if p.start == p.chunk_start {
                    v ^= init_term(p.chunk_end - p.chunk_start);
                }
                out[p.chunk as usize] ^= v;
            }
            let want: Vec<u32> = data.chunks(chunk as usize).map(::crc32c::crc32c).collect();
            assert_eq!(out, want, "chunk {chunk}, piece {piece}");
        }
    }
}
