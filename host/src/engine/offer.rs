//! The offer a sender makes of its transfer, whatever carries it (a new connection's
//! opening, a kept connection's next offer): the header from the options (size, chunks,
//! depth, payload, checks, pieces), and the name message that follows it.

use super::options::SendOptions;
use crate::transfer::plan::ChunkPlan;
use crate::transfer::TransferError;
use crate::wire::{encode_name, Header, Op};

/// The offer of `transfers` transfers of `bytes` bytes under `opts`, and the name
/// message that follows it (empty without a name).
pub fn offer(
    opts: &SendOptions,
    bytes: u64,
    transfers: u32,
    op: Op,
) -> Result<(Header, ChunkPlan, Vec<u8>), TransferError> {
    let plan = ChunkPlan::new(bytes, opts.chunk).map_err(TransferError::Protocol)?;
    let p = &opts.payload;
    let cannot = |e: crate::wire::WireError| {
        TransferError::Protocol(format!("cannot offer this transfer: {e}"))
    };
    let mut header = Header::of(op, bytes, plan.chunk_bytes(), opts.depth, p.payload)
        .and_then(|h| h.with_transfers(transfers))
        .and_then(|h| h.with_payload(p.payload, p.verify, p.max_resends))
        .map_err(cannot)?;
    if p.verify.checksum() {
        // This sender answers piece requests: a failed chunk comes again in pieces,
        // each with its own CRC32C, so repair converges on a lossy path.
        header = header.with_pieces();
    }
    let name = match &p.name {
        Some(name) => {
            header = header.with_name();
            encode_name(name).map_err(cannot)?
        }
        None => Vec::new(),
    };
    Ok((header, plan, name))
}
