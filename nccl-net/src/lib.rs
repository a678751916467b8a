//! `libnccl-net-grdma.so`: an NCCL net plugin (`NCCL_NET=grdma`) carrying NCCL's
//! point-to-point messages over TCP, each message striped over several sockets, every
//! piece of it checked with a CRC32C on arrival and sent again when the check fails.
//! Host memory only (`NCCL_PTR_HOST`): NCCL stages GPU data through its host buffers,
//! as with its own `Socket` transport. How to turn it on: docs/nccl-plugin.md.
//!
//! One concept per module:
//! - [`abi`]: NCCL's structs and function tables, declared from its headers;
//! - `ffi`: the exported tables and their entry points (the only code NCCL calls);
//! - `log`: NCCL's logger;
//! - `config`: the environment variables;
//! - `props`: the interfaces (devices) and their properties;
//! - `wire`: every byte that is not data (handle, hellos, piece headers, control);
//! - `integrity`: CRC32C, fault injection, counters;
//! - `sock`: thin non-blocking socket wrappers over raw memory;
//! - `trace`: NCCL_GRDMA_TRACE's per-request timeline;
//! - `comm`: listen/connect/accept and the send and receive comms with their progress
//!   over TCP;
//! - `verbs`: the same over RDMA verbs (a queue pair per comm, RDMA WRITEs into NCCL's
//!   buffers), where the device is an RDMA device's interface.

pub mod abi;
mod comm;
mod config;
mod error;
mod ffi;
mod integrity;
mod log;
mod props;
mod sock;
mod trace;
mod verbs;
mod wire;
