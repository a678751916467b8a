//! The buffers the NIC reads from (sender) and writes into (receiver), whatever memory
//! they live in. The transfer code sees only these two traits, so it is the same for
//! host memory, GPU-mapped host memory, GPU memory read directly by the NIC (GPUDirect
//! RDMA) and GPU memory staged through host memory.

pub mod host_buffer;
pub mod lent;

pub use host_buffer::HostBuffer;
pub use lent::LentBytes;

use anyhow::Result;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::time::Instant;

/// How the NIC must register a piece of memory. Only [`Registrable`] implementations,
/// which are `unsafe`, hand these to the RDMA layer, so a value built by safe code can
/// never be registered.
#[derive(Debug, Clone, Copy)]
pub enum RegistrationTarget<'a> {
    /// Ordinary (or page-locked) host memory: `ibv_reg_mr` on a CPU address.
    Host { ptr: NonNull<u8>, len: usize },
    /// GPU memory exported as a dma-buf: `ibv_reg_dmabuf_mr(fd, offset, len, iova)`.
    /// `iova` is the address work requests use for the region (the GPU address).
    DmaBuf {
        fd: BorrowedFd<'a>,
        offset: u64,
        len: usize,
        iova: u64,
    },
    /// GPU memory by its device address: `ibv_reg_mr` on it, which works only where the
    /// nvidia-peermem module lets the NIC driver pin GPU pages.
    DeviceAddress { addr: u64, len: usize },
}

impl RegistrationTarget<'_> {
    pub fn len(&self) -> usize {
        match *self {
            RegistrationTarget::Host { len, .. }
            | RegistrationTarget::DmaBuf { len, .. }
            | RegistrationTarget::DeviceAddress { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address a work request uses for byte 0 of the region.
    pub fn base_address(&self) -> u64 {
        match *self {
            RegistrationTarget::Host { ptr, .. } => ptr.as_ptr() as u64,
            RegistrationTarget::DmaBuf { iova, .. } => iova,
            RegistrationTarget::DeviceAddress { addr, .. } => addr,
        }
    }

    /// Whether the NIC would reach GPU memory through this registration.
    pub fn is_gpu_memory(&self) -> bool {
        !matches!(self, RegistrationTarget::Host { .. })
    }
}

/// Memory that a memory region may cover.
///
/// # Safety
/// Implementors promise that the memory [`target`](Registrable::target) describes (and,
/// for a dma-buf, the file descriptor) stays allocated, unmoved and open for as long as
/// `self` is borrowed: a [`MemoryRegion`](crate::rdma::MemoryRegion) borrows the value
/// it registers, so the memory then outlives the registration by construction.
pub unsafe trait Registrable {
    fn target(&self) -> RegistrationTarget<'_>;
}

/// The road the bytes take between memory and the wire, named truthfully for output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// The CPU wrote the pattern into host memory (`--gpu none`, or no GPU found).
    HostMemory,
    /// The GPU kernel wrote into page-locked host memory mapped into the GPU; the NIC
    /// reads host memory. Not GPUDirect RDMA.
    GpuMappedHostMemory,
    /// The NIC reads (or writes) GPU memory directly: GPUDirect RDMA.
    GpuDirectRdma,
    /// The GPU's memory is copied chunk by chunk into registered host memory, overlapped
    /// with the sends.
    StagedThroughHostMemory,
}

impl DataPath {
    /// The words used in "Data sent successfully via ...".
    pub fn describe(self) -> &'static str {
        match self {
            DataPath::HostMemory => "RDMA from host memory (pattern written by the CPU)",
            DataPath::GpuMappedHostMemory => "RDMA from GPU-mapped host memory",
            DataPath::GpuDirectRdma => "GPUDirect RDMA",
            DataPath::StagedThroughHostMemory => "RDMA from host memory staged from GPU memory",
        }
    }
}

/// The sender's data, already generated, ready for the wire.
///
/// Every method takes `&self`: the transfer registers [`memory`](SendSource::memory) for
/// the whole transfer (the region borrows it), and a staging ring still has to move its
/// slots on meanwhile, through interior mutability.
///
/// # Safety
/// The chunk schedule ([`Schedule::run`](crate::transfer::schedule::Schedule::run)) and
/// the wires read the memory behind the ranges this trait hands out from other threads,
/// the GPU's copy engine or the NIC, trusting that:
/// - [`memory`](SendSource::memory) is the same memory for as long as `self` lives;
/// - a range [`prepare_chunk`](SendSource::prepare_chunk) returns lies inside that
///   memory and holds the chunk's bytes, and those bytes stay valid and unmodified until
///   [`release_chunk`](SendSource::release_chunk) is called for the chunk (a chunk never
///   released stays untouched for the life of `self`: [`begin_pass`](SendSource::begin_pass)
///   fails rather than reuse its bytes).
pub unsafe trait SendSource {
    /// Bytes to send.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory the chunks are read from: registered once per connection.
    fn memory(&self) -> &dyn Registrable;

    /// How many chunks may be posted and not yet completed, if this source limits it
    /// (a staging ring has a fixed number of slots).
    fn max_chunks_in_flight(&self) -> Option<usize> {
        None
    }

    /// Start a pass over the data: every transfer is one, from chunk 0 in order. Fails if
    /// a chunk of the last pass is still in flight.
    fn begin_pass(&self) -> Result<()> {
        Ok(())
    }

    /// Make bytes `[offset, offset + len)` of the data available in [`memory`] and
    /// return where in it they lie (a byte range of the registered memory). A staged
    /// source waits here, until `deadline`, for the copy of that chunk.
    ///
    /// [`memory`]: SendSource::memory
    fn prepare_chunk(&self, offset: usize, len: usize, deadline: Instant) -> Result<Range<usize>>;

    /// The wire has finished reading the chunk that starts at `offset`: its slot may be
    /// reused.
    ///
    /// # Safety
    /// Nothing reads the chunk's bytes any more: the schedule calls this only after its
    /// wire reported the chunk done. (A safe caller that released a chunk still on the
    /// wire would let a staging ring overwrite bytes the NIC or a writer thread reads.)
    unsafe fn release_chunk(&self, _offset: usize) {}

    /// The first few elements, read back for the user (`First 5 values: ...`).
    fn first_values(&self, count: usize) -> Result<Vec<i32>>;

    fn path(&self) -> DataPath;

    /// Copy `dest.len()` bytes of the data from `offset` out to the host, by a copy (a
    /// chunk to send again after its checksum failed at the receiver). Works between
    /// passes, whatever the staging ring holds.
    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()>;

    /// The CRC32C of every `chunk` bytes of the data, computed where the data lives when
    /// that is GPU memory (the checksum kernel); `None` where the wire computes them on
    /// the CPU from the bytes it sends.
    fn chunk_checksums(&self, _chunk: usize) -> Option<Result<Vec<u32>>> {
        None
    }
}

/// What the receiver found when it checked the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    /// Elements compared.
    pub elements: u64,
    /// Elements that differ from the pattern.
    pub mismatches: u64,
    /// The lowest index of a mismatch.
    pub first_mismatch: Option<u64>,
    /// CRC-32 (IEEE) of the bytes, where the receiver could compute it on the CPU.
    pub crc32: Option<u32>,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.mismatches == 0
    }
}

/// The receiver's buffer. As with [`SendSource`], `&self` throughout: the connection's
/// memory region borrows [`memory`](RecvSink::memory) while transfers come and go.
///
/// # Safety
/// The receiver registers [`memory`](RecvSink::memory), in write mode for the peer to
/// write at any time while the region lives, and trusts that:
/// - it is the same memory, of at least [`len`](RecvSink::len) bytes, for as long as
///   `self` lives;
/// - no method reads or writes it through a Rust reference (`&[u8]`, `&mut [u8]`): a
///   peer may be writing it meanwhile, so the CPU reaches it only by copies through raw
///   pointers, and the GPU by kernels and driver copies.
pub unsafe trait RecvSink {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory to register; it is the only remotely writable memory of a connection.
    fn memory(&self) -> &dyn Registrable;

    /// Fill the buffer with a value no element of the pattern has (the pattern is even,
    /// the poison odd), so data that never arrived cannot pass verification. Called
    /// before a transfer's receives are posted, never while the NIC may write.
    fn poison(&self) -> Result<()>;

    /// Check the first `len` bytes against the pattern (element `i` = `pattern::value(i)`).
    fn verify(&self, len: usize) -> Result<Verification>;

    /// Up to `count` leading elements, for the user.
    fn first_values(&self, count: usize) -> Result<Vec<i32>>;

    fn path(&self) -> DataPath;

    /// CRC32C of every `chunk` bytes of bytes `range` (the last piece may be shorter),
    /// where the data landed (`--verify checksum`): the CPU for host memory, the
    /// `crc32c_chunks` kernel for GPU memory. Never while the NIC may write the range.
    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>> {
        let _ = (range, chunk);
        anyhow::bail!("this receive buffer cannot compute checksums")
    }

    /// Write the first `len` bytes to `out` (`host recv --output`), by copies.
    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()> {
        let _ = (len, out);
        anyhow::bail!("this receive buffer cannot be written out")
    }
}

/// The 32-bit word [`RecvSink::poison`] fills with: odd, so never `pattern::value(i)`.
pub const POISON: u32 = 0xdead_beef;
