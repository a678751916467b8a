//! The promises the types make, each shown by code the compiler refuses.
//!
//! Safe code must not be able to reach undefined behaviour through this crate: not by
//! leaking a value (`mem::forget` and `Rc` cycles are safe, so a destructor is never a
//! guarantee), not by implementing a trait badly, not by juggling CUDA contexts. Each
//! section below names one promise and holds a `compile_fail` example that breaks it (the
//! doctest fails if that code ever compiles, with the error code given), beside the same
//! code done right, which must compile. `cargo test --doc -p host` runs them; the README's
//! soundness section says which promises rest on types, which on run-time checks, and
//! which remain the caller's.
//!
//! # A wire's threads cannot outlive the source they read
//!
//! The memcpy and TCP wires read the sender's memory on threads of their own. They exist
//! only inside a scope, like `std::thread::scope`: the threads are joined before
//! [`MemcpyWire::scope`](crate::transfer::memcpy_wire::MemcpyWire::scope) returns, so
//! there is no wire to forget with its threads still reading.
//!
//! ```
//! use host::memory::HostBuffer;
//! use host::transfer::memcpy_wire::MemcpyWire;
//! let source = HostBuffer::with_pattern(4096).unwrap();
//! let (_, copy) = MemcpyWire::scope(&source, vec![0; 4096], |_wire| ()).unwrap();
//! assert_eq!(copy.len(), 4096);
//! ```
//!
//! ```compile_fail,E0521
//! use host::memory::HostBuffer;
//! use host::transfer::memcpy_wire::MemcpyWire;
//! let source = HostBuffer::with_pattern(4096).unwrap();
//! let mut kept = None;
//! // Smuggle the wire out of its scope, to forget it later: refused.
//! MemcpyWire::scope(&source, vec![0; 4096], |wire| kept = Some(wire)).unwrap();
//! ```
//!
//! # Safe code cannot implement the traits unsafe code trusts
//!
//! The chunk schedule hands a source's byte ranges to wires that read them on other
//! threads or through the NIC, and gives a chunk back only when its wire reports it done.
//! Both sides are `unsafe trait`s, and giving a chunk back early is an `unsafe fn`.
//!
//! ```compile_fail,E0200
//! use host::memory::{DataPath, Registrable, SendSource};
//! struct Rewrites(host::memory::HostBuffer);
//! impl SendSource for Rewrites {
//!     fn len(&self) -> usize { 4096 }
//!     fn memory(&self) -> &dyn Registrable { &self.0 }
//!     fn prepare_chunk(&self, o: usize, l: usize, _: std::time::Instant)
//!         -> anyhow::Result<std::ops::Range<usize>> { Ok(o..o + l) }
//!     fn first_values(&self, _: usize) -> anyhow::Result<Vec<i32>> { Ok(vec![]) }
//!     fn path(&self) -> DataPath { DataPath::HostMemory }
//! }
//! ```
//!
//! ```compile_fail,E0200
//! use host::rdma::Deadline;
//! use host::transfer::schedule::{ChunkWire, Done, Posted, WireError};
//! struct ReportsEarly;
//! impl ChunkWire for ReportsEarly {
//!     unsafe fn post(&mut self, _: &[Posted]) -> Result<(), WireError> { Ok(()) }
//!     fn wait(&mut self, _: &Deadline) -> Result<Option<Done>, WireError> { Ok(None) }
//!     fn drain(&mut self, _: &Deadline) {} // "nothing reads them any more": unchecked
//! }
//! ```
//!
//! # A source is never rewritten while a wire may read it
//!
//! A pass ([`Schedule::run`](crate::transfer::schedule::Schedule::run)) returns only once
//! its wire reads none of the chunks it was given, also when it fails early (the wire is
//! drained, [`ChunkWire::drain`](crate::transfer::schedule::ChunkWire::drain)), and never
//! takes another pass's reports for its own (every chunk and report names its pass). In
//! between, a host buffer is written only through `&mut self`, which no borrow lent to a
//! wire allows (the run-time half: `transfer::memcpy_wire`'s and `engine::sending`'s
//! tests, the memcpy ones under Miri).
//!
//! ```
//! use host::memory::HostBuffer;
//! use host::transfer::memcpy_wire::MemcpyWire;
//! let mut source = HostBuffer::zeroed(4096).unwrap();
//! source.write_at(0, b"before the wire").unwrap();
//! MemcpyWire::scope(&source, vec![0; 4096], |_wire| ()).unwrap();
//! source.write_at(0, b"after it").unwrap();
//! ```
//!
//! ```compile_fail,E0502
//! use host::memory::HostBuffer;
//! use host::transfer::memcpy_wire::MemcpyWire;
//! let mut source = HostBuffer::zeroed(4096).unwrap();
//! // Rewrite the source while the wire may be reading it: refused.
//! MemcpyWire::scope(&source, vec![0; 4096], |_wire| source.write_at(0, b"x").unwrap()).unwrap();
//! ```
//!
//! ```compile_fail,E0133
//! use host::memory::{HostBuffer, SendSource};
//! let source = HostBuffer::with_pattern(4096).unwrap();
//! source.release_chunk(0); // "the wire is done with it": only unsafe code may say so
//! ```
//!
//! # A queue pair cannot outlive a region it was given
//!
//! A [`QueuePair`](crate::rdma::QueuePair)`<'r>` takes only [`Sge`](crate::rdma::Sge)`<'r>`s
//! and is invariant in `'r`, so every region it was given outlives it: the queue pair is
//! destroyed first (a covariant `'r` let it take a shorter-lived region's SGE).
//!
//! ```no_run
//! use host::memory::HostBuffer;
//! use host::rdma::{MemoryRegion, ProtectionDomain, QueuePair};
//! use std::rc::Rc;
//! fn post<'r>(qp: &QueuePair<'r>, pd: &Rc<ProtectionDomain>, buffer: &'r HostBuffer) {
//!     let mr = MemoryRegion::register(pd, buffer).unwrap();
//!     let mr: &'r MemoryRegion<'r> = Box::leak(Box::new(mr));
//!     // SAFETY: (not run) nothing touches the buffer until the receive completes.
//!     unsafe { qp.post_recv(0, Some(mr.sge(0..64).unwrap())).unwrap() };
//! }
//! ```
//!
//! ```compile_fail,E0597
//! use host::memory::HostBuffer;
//! use host::rdma::{MemoryRegion, ProtectionDomain, QueuePair};
//! use std::rc::Rc;
//! fn post(qp: &QueuePair<'_>, pd: &Rc<ProtectionDomain>) {
//!     let buffer = HostBuffer::zeroed(64).unwrap();
//!     let mr = MemoryRegion::register(pd, &buffer).unwrap();
//!     // SAFETY: (not run) the point is that it does not compile.
//!     unsafe { qp.post_recv(0, Some(mr.sge(0..64).unwrap())).unwrap() };
//! } // the region and the buffer die here, before the queue pair
//! ```
//!
//! # A region the peer may write cannot be leaked by safe code
//!
//! A leaked registration stays registered; with remote write, the peer holding its rkey
//! would then write memory that has been freed. So only local registration is safe.
//!
//! ```compile_fail,E0133
//! use host::memory::HostBuffer;
//! use host::rdma::{MemoryRegion, ProtectionDomain};
//! fn leak(pd: &std::rc::Rc<ProtectionDomain>) {
//!     let buffer = HostBuffer::zeroed(64).unwrap();
//!     let mr = MemoryRegion::register_remote_writable(pd, &buffer).unwrap();
//!     std::mem::forget(mr);
//! }
//! ```
//!
//! # No shared slice over memory a peer may write
//!
//! Buffers hand out slices only from `&mut self`, which a registration's borrow excludes;
//! their shared methods copy bytes out through raw pointers.
//!
//! ```no_run
//! use host::memory::HostBuffer;
//! use host::rdma::{MemoryRegion, ProtectionDomain};
//! fn read(pd: &std::rc::Rc<ProtectionDomain>) {
//!     let mut buffer = HostBuffer::zeroed(64).unwrap();
//!     // SAFETY: (not run) dropped below, before the buffer; no reference reads it.
//!     let mr = unsafe { MemoryRegion::register_remote_writable(pd, &buffer) }.unwrap();
//!     let copy = buffer.read_prefix(64); // a copy: fine while the peer may write
//!     drop(mr);
//!     let bytes: &[u8] = buffer.as_bytes(); // a slice once the region is gone
//!     assert_eq!(copy, bytes);
//! }
//! ```
//!
//! ```compile_fail,E0502
//! use host::memory::HostBuffer;
//! use host::rdma::{MemoryRegion, ProtectionDomain};
//! fn read(pd: &std::rc::Rc<ProtectionDomain>) {
//!     let mut buffer = HostBuffer::zeroed(64).unwrap();
//!     // SAFETY: (not run) the point is that it does not compile.
//!     let mr = unsafe { MemoryRegion::register_remote_writable(pd, &buffer) }.unwrap();
//!     let bytes: &[u8] = buffer.as_bytes(); // while the peer may write it: refused
//!     drop(mr);
//!     let _ = bytes;
//! }
//! ```
//!
//! # Memory a library caller lends is used only while it is lent
//!
//! [`api::Endpoint::send`](crate::api::Endpoint::send) reads the caller's bytes in place
//! through [`LentBytes`](crate::memory::LentBytes), which borrows them: it cannot outlive
//! them. [`api::Listener::receive_into`](crate::api::Listener::receive_into) borrows the
//! buffer mutably for the call and returns only once nothing uses it (the lent target's
//! token, held by the landing, is gone: Miri runs `memory::lent`'s tests).
//!
//! ```
//! let data = vec![7u8; 4096];
//! let lent = host::memory::LentBytes::new(&data);
//! drop(lent);
//! drop(data);
//! ```
//!
//! ```compile_fail,E0597
//! let lent = {
//!     let data = vec![7u8; 4096];
//!     // Keep reading the bytes after their owner is gone: refused.
//!     host::memory::LentBytes::new(&data)
//! };
//! drop(lent);
//! ```
//!
//! ```compile_fail,E0499
//! fn receive_twice(listener: &host::api::Listener, buf: &mut [u8]) {
//!     let other = &mut *buf;
//!     // The buffer is the receive's alone while it runs: no second borrow beside it.
//!     let _ = listener.receive_into(buf);
//!     other[0] = 1;
//! }
//! ```
//!
//! # The GPU's promises
//!
//! With the `cuda` feature, the [`gpu`](crate::gpu) module's documentation holds the rest:
//! no slice over page-locked memory a peer may write, no device code but this crate's
//! kernels from safe code, buffers of one GPU refused by another, uploads not read before
//! their copies land.
