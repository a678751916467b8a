//! Library half of the `host` binary: every module, so integration tests and benchmarks
//! can use them. `main.rs` only parses the command line and calls into here.

pub mod memory;
