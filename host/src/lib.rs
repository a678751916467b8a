//! Library half of the `host` binary: every module, so integration tests and benchmarks
//! can use them. `main.rs` only parses the command line and calls into here.

pub mod api;
pub mod cli;
pub mod engine;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod integrity;
pub mod memory;
pub mod memory_factory;
pub mod memory_path;
pub mod net;
pub mod rails;
pub mod rdma;
pub mod server;
pub mod soundness;
pub mod topology;
pub mod transfer;
pub mod transport;
pub mod units;
pub mod wire;
