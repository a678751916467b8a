//! Cutting a transfer into chunks: one work request each.

/// One chunk: bytes `[offset, offset + len)` of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub index: u64,
    pub offset: u64,
    pub len: u64,
}

impl Chunk {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// `total` bytes in chunks of `chunk` bytes; the last chunk may be shorter. A chunk size
/// larger than the transfer gives one chunk of the whole transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    total: u64,
    chunk: u64,
}

impl ChunkPlan {
    pub fn new(total: u64, chunk: u64) -> Result<ChunkPlan, String> {
        if total == 0 {
            return Err("nothing to transfer (size 0)".into());
        }
        if chunk == 0 {
            return Err("chunk size 0".into());
        }
        Ok(ChunkPlan {
            total,
            chunk: chunk.min(total),
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The chunk size in effect (never more than the total).
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    pub fn count(&self) -> u64 {
        self.total.div_ceil(self.chunk)
    }

    pub fn get(&self, index: u64) -> Option<Chunk> {
        let offset = index.checked_mul(self.chunk)?;
        if offset >= self.total {
            return None;
        }
        Some(Chunk {
            index,
            offset,
            len: self.chunk.min(self.total - offset),
        })
    }

    /// Bytes covered by the first `chunks` chunks.
    pub fn bytes_through(&self, chunks: u64) -> u64 {
        chunks.saturating_mul(self.chunk).min(self.total)
    }

    pub fn iter(&self) -> impl Iterator<Item = Chunk> + '_ {
        (0..self.count()).map_while(|i| self.get(i))
    }
}

/// A pass's tag: every item posted names the pass of the plan it belongs to, and every
/// report of it does too, so a pass never takes another's completions for its own (one
/// that ended early on the same link, say). Opaque to links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pass(pub u64);

impl Pass {
    /// A pass number no earlier pass of this process had.
    pub fn fresh() -> Pass {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Pass(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_covers(plan: &ChunkPlan) {
        let mut next = 0;
        let mut n = 0;
        for c in plan.iter() {
            assert_eq!(c.offset, next);
            assert!(c.len > 0 && c.len <= plan.chunk_bytes());
            assert_eq!(c.index, n);
            next = c.end();
            n += 1;
        }
        assert_eq!(next, plan.total());
        assert_eq!(n, plan.count());
    }

    #[test]
    fn a_single_element() {
        let p = ChunkPlan::new(4, 1 << 20).unwrap();
        assert_eq!(p.count(), 1);
        assert_eq!(
            p.get(0),
            Some(Chunk {
                index: 0,
                offset: 0,
                len: 4
            })
        );
        assert_eq!(p.get(1), None);
        check_covers(&p);
    }

    #[test]
    fn the_seed_buffer_in_one_chunk() {
        let p = ChunkPlan::new(16384, 1 << 20).unwrap();
        assert_eq!((p.count(), p.chunk_bytes()), (1, 16384));
        check_covers(&p);
    }

    #[test]
    fn even_split() {
        let p = ChunkPlan::new(256 << 20, 1 << 20).unwrap();
        assert_eq!(p.count(), 256);
        assert_eq!(p.get(255).unwrap().len, 1 << 20);
        check_covers(&p);
    }

    #[test]
    fn last_chunk_is_partial() {
        let p = ChunkPlan::new(10 * 4096 + 12, 4096).unwrap();
        assert_eq!(p.count(), 11);
        assert_eq!(
            p.get(10),
            Some(Chunk {
                index: 10,
                offset: 40960,
                len: 12
            })
        );
        check_covers(&p);
    }

    #[test]
    fn more_than_a_gib() {
        let total = (1u64 << 30) + 4;
        let p = ChunkPlan::new(total, 1 << 20).unwrap();
        assert_eq!(p.count(), 1025);
        assert_eq!(p.get(1024).unwrap().len, 4);
        assert_eq!(p.bytes_through(1024), 1 << 30);
        assert_eq!(p.bytes_through(1025), total);
        assert_eq!(p.bytes_through(u64::MAX), total);
        check_covers(&p);
    }

    #[test]
    fn chunk_larger_than_total_is_one_chunk() {
        let p = ChunkPlan::new(1000, 4096).unwrap();
        assert_eq!((p.count(), p.chunk_bytes()), (1, 1000));
    }

    #[test]
    fn zero_sizes_are_refused() {
        assert!(ChunkPlan::new(0, 4).is_err());
        assert!(ChunkPlan::new(4, 0).is_err());
    }

    #[test]
    fn tiny_chunks() {
        let p = ChunkPlan::new(4096, 4).unwrap();
        assert_eq!(p.count(), 1024);
        check_covers(&p);
    }

    /// The size arithmetic never overflows or panics, whatever a peer or the command line
    /// puts in: every combination of edge values (a property test over a grid).
    #[test]
    fn no_size_overflows_on_any_edge_value() {
        let edges = [
            0u64,
            1,
            3,
            4,
            4095,
            4096,
            (1 << 20) + 3,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            1 << 62,
            u64::MAX - 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &total in &edges {
            for &chunk in &edges {
                let Ok(p) = ChunkPlan::new(total, chunk) else {
                    assert!(total == 0 || chunk == 0);
                    continue;
                };
                let n = p.count();
                assert!(n >= 1 && p.chunk_bytes() <= total);
                for i in [0, 1, n / 2, n - 1, n, n.saturating_add(1), u64::MAX] {
                    if let Some(c) = p.get(i) {
                        assert!(c.len >= 1 && c.offset.checked_add(c.len).unwrap() <= total);
                    } else {
                        assert!(i >= n);
                    }
                    assert!(p.bytes_through(i) <= total);
                }
                assert_eq!(p.bytes_through(n), total);
            }
        }
    }
}
