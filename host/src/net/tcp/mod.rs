//! TCP as a link of the wire seam: streams grouped into rails, frames placed by their
//! offsets, control messages on any rail.
//!
//! - [`frames`]: the bytes this transport adds (stream hello, frames);
//! - [`socket`]: connecting and timeouts, socket errors in words;
//! - [`dial`]: the sender's opening (the rails' sockets, the offer, the answer, the
//!   hellos and proofs);
//! - [`listen`]: the receiver's accept loop and handshakes, offers to the engine,
//!   further streams to their connection;
//! - [`kept`]: a receiver's connection between transfers, waiting for the sender's next
//!   offer on it;
//! - [`send`], [`recv`]: each end's threads for the life of a connection, lent the
//!   transfer's memory one transfer at a time, and the link over them;
//! - [`streams`]: how many streams a connection opens by default, from the machine.

pub mod dial;
pub mod frames;
pub mod kept;
pub mod listen;
pub mod readers;
pub mod recv;
pub mod send;
pub mod socket;
pub mod streams;

/// What the sender's output says the data went by ("Data sent successfully via ...").
pub fn describe(path: crate::memory::DataPath, user_data: bool) -> &'static str {
    use crate::memory::DataPath;
    match path {
        DataPath::HostMemory if user_data => "TCP from host memory",
        DataPath::HostMemory => "TCP from host memory (pattern written by the CPU)",
        DataPath::GpuMappedHostMemory => "TCP from GPU-mapped host memory",
        DataPath::StagedThroughHostMemory => "TCP from host memory staged from GPU memory",
        DataPath::GpuDirectRdma => "TCP from GPU memory",
    }
}
