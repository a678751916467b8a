//! Bytes handed on only once they are checked again: a writer that holds each chunk
//! until its CRC32C matches the one that passed, for memory the peer may write after its
//! check ([`Caps::peer_writes_in_place`](crate::net::Caps::peer_writes_in_place): the
//! sender's NIC writing the buffer by RDMA WRITE until its registration ends). Without
//! it, a sender that writes again after its CRC32Cs passed would have the receiver
//! store bytes other than those it checked and called verified.

use std::io::{self, Write};

/// A writer in front of `out` that passes the bytes of chunk `k` (of `chunk` bytes, the
/// last one shorter) on only once their CRC32C is `passed[k]`, and fails otherwise: so
/// nothing of a chunk that changed reaches `out` (standard output cannot take bytes
/// back). [`finish`](CheckedOut::finish) checks the last chunk and that every chunk came.
pub struct CheckedOut<'a> {
    out: &'a mut dyn Write,
    chunk: usize,
    passed: &'a [u32],
    /// The chunk being gathered, and its index.
    held: Vec<u8>,
    k: usize,
}

impl<'a> CheckedOut<'a> {
    /// `chunk` must be the plan's chunk size and `passed` one CRC32C per chunk.
    pub fn new(out: &'a mut dyn Write, chunk: usize, passed: &'a [u32]) -> CheckedOut<'a> {
        let chunk = chunk.max(1);
        CheckedOut {
            out,
            chunk,
            passed,
            held: Vec::with_capacity(chunk.min(64 << 20)),
            k: 0,
        }
    }

    /// Check the chunk held and hand it on.
    fn pass_on(&mut self) -> io::Result<()> {
        let Some(&expected) = self.passed.get(self.k) else {
            return Err(io::Error::other(format!(
                "more bytes than the {} chunks checked",
                self.passed.len()
            )));
        };
        if crate::integrity::crc32c(&self.held) != expected {
            return Err(io::Error::other(format!(
                "chunk {} changed after its CRC32C passed (the sender's NIC wrote it again, \
                 --op write): not handed on",
                self.k
            )));
        }
        self.out.write_all(&self.held)?;
        self.held.clear();
        self.k += 1;
        Ok(())
    }

    /// Check and hand on the last chunk; every chunk must have come.
    ///
    /// # Errors
    /// A chunk whose bytes are not those checked, fewer chunks than checked, or `out`'s
    /// own error.
    pub fn finish(mut self) -> io::Result<()> {
        if !self.held.is_empty() {
            self.pass_on()?;
        }
        if self.k != self.passed.len() {
            return Err(io::Error::other(format!(
                "{} of {} chunks handed on",
                self.k,
                self.passed.len()
            )));
        }
        self.out.flush()
    }
}

impl Write for CheckedOut<'_> {
    fn write(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let take = (self.chunk - self.held.len()).min(buf.len());
            self.held.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if self.held.len() == self.chunk {
                self.pass_on()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Bytes of a chunk not yet whole stay held: they are not checked.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::chunk_crcs;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Write `bytes` through a [`CheckedOut`] in pieces of `piece` bytes.
    fn through(
        bytes: &[u8],
        chunk: usize,
        passed: &[u32],
        piece: usize,
    ) -> (io::Result<()>, Vec<u8>) {
        let mut out = Vec::new();
        let result = (|| {
            let mut w = CheckedOut::new(&mut out, chunk, passed);
            for p in bytes.chunks(piece) {
                w.write_all(p)?;
            }
            w.finish()
        })();
        (result, out)
    }

    #[test]
    fn the_bytes_that_passed_go_through_whole_in_any_pieces() {
        let bytes = data(10 * 1000 + 3);
        let passed = chunk_crcs(&bytes, 1000);
        for piece in [1, 7, 999, 1000, 1001, 4096, bytes.len()] {
            let (result, out) = through(&bytes, 1000, &passed, piece);
            result.unwrap();
            assert_eq!(out, bytes, "pieces of {piece}");
        }
    }

    #[test]
    fn a_chunk_changed_after_its_check_is_refused_and_nothing_of_it_goes_on() {
        let bytes = data(5 * 1000 + 10);
        let passed = chunk_crcs(&bytes, 1000);
        let mut changed = bytes.clone();
        changed[3 * 1000 + 17] ^= 0x40;
        let (result, out) = through(&changed, 1000, &passed, 333);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("chunk 3 changed after its CRC32C passed"), "{e}");
        // Chunks 0-2 went on, checked; not a byte of chunk 3.
        assert_eq!(out, bytes[..3000]);
        // The short last chunk too.
        let mut changed = bytes.clone();
        *changed.last_mut().unwrap() ^= 1;
        let (result, out) = through(&changed, 1000, &passed, 4096);
        assert!(result.unwrap_err().to_string().contains("chunk 5 changed"));
        assert_eq!(out, bytes[..5000]);
    }

    #[test]
    fn too_few_or_too_many_bytes_are_refused() {
        let bytes = data(3000);
        let passed = chunk_crcs(&bytes, 1000);
        let (result, _) = through(&bytes[..2000], 1000, &passed, 512);
        assert!(result.unwrap_err().to_string().contains("2 of 3 chunks"));
        let mut more = bytes.clone();
        more.extend_from_slice(&data(1000));
        let (result, out) = through(&more, 1000, &passed, 512);
        assert!(result
            .unwrap_err()
            .to_string()
            .contains("more bytes than the 3 chunks"));
        assert_eq!(out, bytes);
    }
}
